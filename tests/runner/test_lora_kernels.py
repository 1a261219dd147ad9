"""runner/lora/triton_lora.py (the interpreter on CPU, compiled with CUDA)
against each token's own adapter product worked out in float64, and against
the torch masked form over every slot (``stack.lora_add_delta_ref``), on the
shards a tensor-parallel rank holds."""

import pytest
import torch

from runner.lora import triton_lora
from runner.lora.stack import LoRAStack, lora_add_delta_ref
from runner.lora.triton_lora import lora_add_delta_triton
from tests.helpers.kernel_device import KERNEL_DEVICE

DEVICE = KERNEL_DEVICE
# (parts' output rows, input width) of shards a rank holds: a column-parallel
# qkv shard (q, k, v), a gate/up shard, a row-parallel o/down shard (one
# part, input columns of its own, K read in 3 splits; its delta is a partial sum).
SHARDS = {"qkv": ((64, 16, 16), 96), "gate_up": ((80, 80), 72), "row": ((96,), 300)}
# The token's adapter slot, -1 for none. Decode: one token a request.
# Prefill: runs of one request's tokens, more than DECODE_MAX_TOKENS.
DECODE_SLOTS = [2, -1, 0, 1, 2, 0, -1]
PREFILL_SLOTS = [1] * 13 + [-1] * 6 + [0] * 9 + [2] * 3 + [1] * 6


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    """The kernels under test at every token count, whatever the defaults."""
    monkeypatch.setattr(triton_lora, "LORA_TRITON", True)
    monkeypatch.setattr(triton_lora, "LORA_TRITON_MAX_TOKENS", 1 << 30)


def _filled_stack(parts, in_features, rank, num_slots, dtype, gen) -> tuple[LoRAStack, dict]:
    """A stack with an adapter in every slot but the last (left empty), its
    rank cycling rank, rank // 2 (rows past it zero), placed as
    ``LoRAAdapters._place`` places them; returns it and each slot's factors
    {(slot, part): (A [r, in], B [part rows, r], first output row)}."""
    ends = tuple(torch.tensor(parts).cumsum(0).tolist())
    t_max = 64
    mask = torch.zeros(t_max, num_slots, dtype=dtype)
    slots = torch.full((t_max,), -1, dtype=torch.int32)
    stack = LoRAStack(num_slots, ends, rank, in_features, mask, slots, dtype,
                      torch.device("cpu"))
    factors = {}
    for slot in range(num_slots - 1):
        r = rank if slot % 2 == 0 else rank // 2
        for p, size in enumerate(parts):
            a = (torch.randn(r, in_features, generator=gen) / in_features**0.5).to(dtype)
            b = (torch.randn(size, r, generator=gen) * 0.5).to(dtype)
            cols = stack.columns(slot, p)
            stack.a[cols][:r] = a
            stack.b[ends[p] - size : ends[p], cols][:, :r] = b
            factors[slot, p] = (a, b, ends[p] - size)
    return stack, factors


def _own_adapter_delta(x, factors, slots, out_features) -> torch.Tensor:
    """Each token's delta from its own slot's factors alone, in float64."""
    delta = torch.zeros(x.shape[0], out_features, dtype=torch.float64)
    for t, slot in enumerate(slots):
        for (s, _), (a, b, start) in factors.items():
            if s == slot:
                rows = b.shape[0]
                delta[t, start : start + rows] += (x[t].double() @ a.double().T) @ b.double().T
    return delta


def _inputs(slots, stack, in_features, dtype, gen):
    t = len(slots)
    x = torch.randn(t, in_features, generator=gen).to(dtype)
    y = torch.randn(t, stack.b.shape[0], generator=gen).to(dtype)
    stack.token_slot[:t] = torch.tensor(slots, dtype=torch.int32)
    stack.token_mask[:t] = (torch.tensor(slots)[:, None] == torch.arange(stack.num_slots)).to(
        dtype)
    return x, y


def _run(x, y, stack):
    t = x.shape[0]
    args = (stack.a.to(DEVICE), stack.b.to(DEVICE), stack.token_mask[:t].to(DEVICE),
            stack.token_slot[:t].to(DEVICE), stack.part_ends)
    return lora_add_delta_triton(x.to(DEVICE), y.clone().to(DEVICE), *args).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [8, 16])
@pytest.mark.parametrize("shard", sorted(SHARDS))
@pytest.mark.parametrize("slots", [DECODE_SLOTS, PREFILL_SLOTS], ids=["decode", "prefill"])
def test_each_token_gets_its_own_adapters_delta(dtype, rank, shard, slots):
    """Four slots (the last one empty), slot ranks rank and rank // 2,
    tokens of every slot and of none: y + the token's own product, the
    same as the masked form over every slot; tokens of no adapter (and of
    the empty slot) keep y bit for bit."""
    gen = torch.Generator().manual_seed(rank + len(slots))
    parts, in_features = SHARDS[shard]
    slots = [3 if s == -1 and i % 3 == 0 else s for i, s in enumerate(slots)]  # the empty slot
    stack, factors = _filled_stack(parts, in_features, rank, 4, dtype, gen)
    x, y = _inputs(slots, stack, in_features, dtype, gen)
    got = _run(x, y, stack)
    want = y.double() + _own_adapter_delta(x, factors, slots, sum(parts))
    tol = 1e-4 if dtype == torch.float32 else 0.06
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    masked = lora_add_delta_ref(x, y, stack.a, stack.b, stack.token_mask[: len(slots)],
                                stack.token_slot[: len(slots)], stack.part_ends)
    torch.testing.assert_close(got.double(), masked.double(), rtol=tol, atol=tol)
    untouched = torch.tensor([s in (-1, 3) for s in slots])
    assert untouched.any() and torch.equal(got[untouched], y[untouched])
    assert not torch.allclose(got[~untouched].double(), y[~untouched].double(), atol=tol)


def test_graph_padding_rows_take_the_last_rows_adapter_and_leave_real_rows_alone():
    """A decode batch of 5 requests padded to 8 tokens (a captured size):
    the padding tokens carry the last row's slot (``prepare_tokens``); the
    real rows' results are those of the 5 tokens alone."""
    gen = torch.Generator().manual_seed(5)
    parts, in_features = SHARDS["qkv"]
    stack, _ = _filled_stack(parts, in_features, 16, 3, torch.float32, gen)
    real = [1, 0, -1, 1, 0]
    x, y = _inputs(real + [0, 0, 0], stack, in_features, torch.float32, gen)
    padded = _run(x, y, stack)
    _inputs(real, stack, in_features, torch.float32, gen)
    alone = _run(x[:5], y[:5], stack)
    torch.testing.assert_close(padded[:5], alone, rtol=1e-5, atol=1e-5)


# (switch, its value, tokens in the step): the off switch; a step above a
# limit of 2; a step one token above the default limit.
_MASKED_CASES = [("LORA_TRITON", False, 3), ("LORA_TRITON_MAX_TOKENS", 2, 3),
                 ("LORA_TRITON_MAX_TOKENS", triton_lora.LORA_TRITON_MAX_TOKENS,
                  triton_lora.LORA_TRITON_MAX_TOKENS + 1)]


@pytest.mark.parametrize("flag,value,tokens", _MASKED_CASES)
def test_off_switch_and_larger_steps_give_the_masked_form(monkeypatch, flag, value, tokens):
    """LORA_TRITON False (the lora-masked variant), or a step of more tokens
    than LORA_TRITON_MAX_TOKENS: the torch masked form itself."""
    gen = torch.Generator().manual_seed(1)
    parts, in_features = SHARDS["row"]
    stack, _ = _filled_stack(parts, in_features, 8, 2, torch.float32, gen)
    slots = [(0, -1, 1)[t % 3] for t in range(tokens)]
    x, y = _inputs(slots, stack, in_features, torch.float32, gen)
    want = lora_add_delta_ref(x, y, stack.a, stack.b, stack.token_mask[:tokens],
                              stack.token_slot[:tokens], stack.part_ends)
    monkeypatch.setattr(triton_lora, flag, value)
    got = lora_add_delta_triton(x, y, stack.a, stack.b, stack.token_mask[:tokens],
                                stack.token_slot[:tokens], stack.part_ends)
    assert torch.equal(got, want)


def test_shrink_splits_k_for_few_tokens_only():
    assert triton_lora.shrink_splits(1, 14336, 132) == 16  # one decode token: 16 programs
    assert triton_lora.shrink_splits(1, 96, 132) == 1  # one tile of K
    assert triton_lora.shrink_splits(256, 4096, 132) == 2  # a prefill of 2048 tokens
    assert triton_lora.tokens_per_program(16) == 1 and triton_lora.tokens_per_program(17) == 8
