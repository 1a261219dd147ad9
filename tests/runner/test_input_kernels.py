"""Device-side input builders: Triton kernels and torch references vs a Python oracle.

The oracle below walks the batch row by row with plain Python lists, the way
the seed's worked example reads; both the torch reference and the Triton
kernel (interpreted on CPU) must match it on every element of every buffer,
including the elements they must leave alone (poisoned with -777 first).
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

from runner.ops import device_ops, torch_ops, triton_ops
from tests.helpers.kernel_device import KERNEL_DEVICE

POISON = -777
# Triton kernels run compiled on CUDA tensors where there is a GPU, else interpreted on CPU.
TRITON_DEVICE = KERNEL_DEVICE


def builders(ops) -> dict:
    """The five input builders of one DeviceOps, each behind its size checks."""
    return dict(
        prefill=ops.prepare_prefill_inputs,
        pos=ops.prepare_pos_seq_lens,
        combine=ops.combine_sampled_tokens,
        gather=ops.gather_block_tables,
        slots=ops.compute_slot_mappings,
    )


IMPLS = {
    "ref": builders(torch_ops(torch.device("cpu"))),
    "triton": builders(triton_ops(TRITON_DEVICE)),
    # What the runner gets for a device (below: the CPU; on CUDA, test_random_batches_on_cuda).
    "public": builders(device_ops(torch.device("cpu"))),
}


@dataclass
class Batch:
    """Persistent state (indexed by slot) plus one step's plan (indexed by batch row)."""

    block_size: int
    max_num_batched_tokens: int
    all_token_ids: list[list[int]]
    prefill_len: list[int]
    num_computed: list[int]
    last_sampled: list[int]
    table: list[list[int]]
    slots: list[int]  # batch row -> slot
    query_lens: list[int]
    num_reqs_padded: int
    num_tokens_padded: int

    @property
    def max_num_reqs(self) -> int:
        return len(self.prefill_len)

    @property
    def num_reqs(self) -> int:
        return len(self.slots)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def query_start_loc(self) -> list[int]:
        qsl = [0]
        for n in self.query_lens:
            qsl.append(qsl[-1] + n)
        return qsl + [qsl[-1]] * (self.max_num_reqs - self.num_reqs)


def split(rng: random.Random, total: int, parts: int) -> list[int]:
    """A random composition of total into parts positive integers."""
    if parts == 0:
        return []
    cuts = sorted(rng.sample(range(1, total), parts - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


def make_batch(
    rng: random.Random,
    block_size: int,
    num_reqs: int,
    num_tokens: int,
    max_num_reqs: int = 16,
    max_model_len: int = 96,
    max_num_batched_tokens: int = 64,
) -> Batch:
    """A batch of decodes, prefill chunks and mixed rows."""
    m, length = max_num_reqs, max_model_len
    blocks = -(-length // block_size)
    batch = Batch(
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        all_token_ids=[[rng.randrange(1, 50000) for _ in range(length)] for _ in range(m)],
        prefill_len=[rng.randrange(0, length) for _ in range(m)],  # garbage in unused slots
        num_computed=[rng.randrange(0, length) for _ in range(m)],
        last_sampled=[rng.randrange(1, 50000) for _ in range(m)],
        table=[[rng.randrange(0, 4096) for _ in range(blocks)] for _ in range(m)],
        slots=rng.sample(range(m), num_reqs),
        query_lens=split(rng, num_tokens, num_reqs),
        num_reqs_padded=rng.randint(num_reqs, m),
        num_tokens_padded=rng.randint(num_tokens, max_num_batched_tokens),
    )
    for slot, n in zip(batch.slots, batch.query_lens):
        kind = rng.choice(["decode", "prefill", "mixed"])
        if kind == "decode" and n == 1:
            prefill = rng.randint(1, length - n)
            computed = rng.randint(prefill, length - n)
        elif kind == "mixed" and n >= 2:  # a chunk that runs past the prefill end
            computed = rng.randint(0, length - n)
            prefill = rng.randint(computed + 1, computed + n - 1)
        else:  # a prefill chunk, possibly the last one (seq_len == prefill_len)
            computed = rng.randint(0, length - n)
            prefill = rng.randint(computed + n, length)
        batch.prefill_len[slot] = prefill
        batch.num_computed[slot] = computed
    return batch


@dataclass
class Expected:
    input_ids: list[int]
    positions: list[int]
    seq_lens: list[int]
    logits_indices: list[int]
    block_tables: list[list[int]]
    slot_mapping: list[int]


def oracle(b: Batch) -> Expected:
    """Row-by-row Python statement of what the five builders must write."""
    t_max, m = b.max_num_batched_tokens, b.max_num_reqs
    cols = len(b.table[0])
    exp = Expected(
        input_ids=[POISON] * t_max,
        positions=[POISON] * t_max,
        seq_lens=[0] * m,
        logits_indices=[],
        block_tables=[[POISON] * cols for _ in range(m)],
        slot_mapping=[POISON] * t_max,
    )
    qsl = b.query_start_loc
    for i, (s, n) in enumerate(zip(b.slots, b.query_lens)):
        computed, prefill, end = b.num_computed[s], b.prefill_len[s], qsl[i + 1]
        exp.seq_lens[i] = computed + n
        for k in range(n):
            t, p = qsl[i] + k, computed + k
            exp.positions[t] = p
            if p < prefill:
                exp.input_ids[t] = b.all_token_ids[s][p]
            blk = b.table[s][p // b.block_size]
            exp.slot_mapping[t] = blk * b.block_size + p % b.block_size
        if computed + n > prefill:
            exp.input_ids[end - 1] = b.last_sampled[s]
        exp.logits_indices.append(end - 1)
        exp.block_tables[i] = list(b.table[s])
    for i in range(b.num_reqs, b.num_reqs_padded):
        exp.block_tables[i] = [0] * cols
    for t in range(b.num_tokens, b.num_tokens_padded):
        exp.slot_mapping[t] = -1
    return exp


def run_step(
    b: Batch, impl: dict, last_2d: bool = False, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Build device tensors for b, poison the outputs, run the five builders in step order.

    Returns every buffer and returned view, moved to the CPU.
    """
    torch.set_default_device(device)
    try:
        return {k: v.cpu() for k, v in _run_step(b, impl, last_2d).items()}
    finally:
        torch.set_default_device(None)


def _run_step(b: Batch, impl: dict, last_2d: bool) -> dict[str, torch.Tensor]:
    i32, i64 = torch.int32, torch.int64
    m, t_max = b.max_num_reqs, b.max_num_batched_tokens
    last = torch.tensor(b.last_sampled, dtype=i64)
    inp = dict(
        idx_mapping=torch.tensor(b.slots + [POISON] * (m - b.num_reqs), dtype=i32),
        qsl=torch.tensor(b.query_start_loc, dtype=i32),
        last=last.view(-1, 1) if last_2d else last,
        prefill_len=torch.tensor(b.prefill_len, dtype=i32),
        computed=torch.tensor(b.num_computed, dtype=i32),
        table=torch.tensor(b.table, dtype=i32),
        all_token_ids=torch.tensor(b.all_token_ids, dtype=i32),
    )
    out = dict(
        input_ids=torch.full((t_max,), POISON, dtype=i32),
        positions=torch.full((t_max,), POISON, dtype=i64),
        seq_lens=torch.full((m,), POISON, dtype=i32),
        logits=torch.full((t_max,), POISON, dtype=i64),
        block_tables=torch.full((m, len(b.table[0])), POISON, dtype=i32),
        slot_mapping=torch.full((t_max,), POISON, dtype=i64),
    )
    with no_device_sync():
        _build(b, impl, inp, out)
    views = {"logits_view": "logits", "tables_view": "block_tables", "slots_view": "slot_mapping"}
    for view, buffer in views.items():
        same = out[view].untyped_storage().data_ptr() == out[buffer].untyped_storage().data_ptr()
        assert same and out[view].storage_offset() == 0, f"{view} must alias {buffer}"
    return out


@contextmanager
def no_device_sync():
    """On CUDA, make any synchronizing call (.item(), .tolist(), nonzero, ...) raise."""
    if not torch.cuda.is_available():
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _build(b: Batch, impl: dict, inp: dict, out: dict) -> None:
    """The five builders in step order, as the runner calls them."""
    n, idx, qsl, table = b.num_reqs, inp["idx_mapping"], inp["qsl"], inp["table"]
    impl["prefill"](
        out["input_ids"], idx, qsl, inp["all_token_ids"], inp["prefill_len"], inp["computed"], n
    )
    impl["pos"](idx, qsl, inp["computed"], out["positions"], out["seq_lens"], n)
    out["logits_view"] = impl["combine"](
        out["input_ids"], idx, inp["last"], qsl, out["seq_lens"], inp["prefill_len"],
        out["logits"], n,
    )  # fmt: skip
    out["tables_view"] = impl["gather"](table, idx, out["block_tables"], n, b.num_reqs_padded)
    out["slots_view"] = impl["slots"](
        table, idx, qsl, out["positions"], b.block_size, out["slot_mapping"], n,
        b.num_tokens, b.num_tokens_padded,
    )  # fmt: skip


def check(b: Batch, out: dict[str, torch.Tensor]) -> None:
    exp = oracle(b)
    assert out["input_ids"].tolist() == exp.input_ids
    assert out["positions"].tolist() == exp.positions
    assert out["seq_lens"].tolist() == exp.seq_lens
    assert out["logits_view"].tolist() == exp.logits_indices
    num_logits = len(exp.logits_indices)
    assert out["logits"][num_logits:].tolist() == [POISON] * (b.max_num_batched_tokens - num_logits)
    assert out["block_tables"].tolist() == exp.block_tables
    assert out["tables_view"].shape[0] == b.num_reqs_padded
    assert out["slot_mapping"].tolist() == exp.slot_mapping
    assert out["slots_view"].shape[0] == b.num_tokens_padded


def random_sizes(rng: random.Random, case: int, m: int = 16, t_max: int = 64) -> tuple[int, int]:
    """(num_reqs, num_tokens): empty, full, single request, then random."""
    if case == 0:
        return 0, 0
    if case == 1:
        return m, t_max
    if case == 2:
        return 1, rng.randint(1, 40)
    num_reqs = rng.randint(1, m)
    return num_reqs, rng.randint(num_reqs, t_max)


@pytest.mark.parametrize("impl", ["ref", "triton", "public"])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_random_batches_match_oracle(impl: str, block_size: int) -> None:
    rng = random.Random(1000 * block_size)
    for case in range(8):
        num_reqs, num_tokens = random_sizes(rng, case)
        batch = make_batch(rng, block_size, num_reqs, num_tokens)
        device = TRITON_DEVICE if impl == "triton" else "cpu"
        check(batch, run_step(batch, IMPLS[impl], last_2d=case % 2 == 1, device=device))


def test_random_batches_exercise_every_row_kind() -> None:
    """Guard for the test above: its batches hold decodes, chunks and mixed rows."""
    rng = random.Random(7)
    seen = set()
    for case in range(40):
        num_reqs, num_tokens = random_sizes(rng, case)
        b = make_batch(rng, 16, num_reqs, num_tokens)
        for s, n in zip(b.slots, b.query_lens):
            computed, prefill = b.num_computed[s], b.prefill_len[s]
            if computed >= prefill:
                seen.add("decode")
            elif computed + n > prefill:
                seen.add("mixed")
            else:
                seen.add("last_chunk" if computed + n == prefill else "chunk")
    assert seen == {"decode", "mixed", "chunk", "last_chunk"}


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_seed_worked_example(impl: str) -> None:
    """Block size 16, 1024 slots: R1 (slot 1023, 40 computed) and R2 (slot 1022, 17
    computed) decode; R3 (slot 1021) is a new 6-token prompt. Batch [R1, R2, R3]."""
    rng = random.Random(3)
    m, length, bs = 1024, 64, 16
    b = Batch(
        block_size=bs,
        max_num_batched_tokens=16,
        all_token_ids=[[0] * length for _ in range(m)],
        prefill_len=[0] * m,
        num_computed=[0] * m,
        last_sampled=[rng.randrange(1, 50000) for _ in range(m)],
        table=[[rng.randrange(0, 4096) for _ in range(length // bs)] for _ in range(m)],
        slots=[1023, 1022, 1021],
        query_lens=[1, 1, 6],
        num_reqs_padded=4,
        num_tokens_padded=8,
    )
    prompt = [101, 102, 103, 104, 105, 106]
    b.all_token_ids[1021][:6] = prompt
    b.prefill_len[1023], b.num_computed[1023] = 12, 40
    b.prefill_len[1022], b.num_computed[1022] = 9, 17
    b.prefill_len[1021], b.num_computed[1021] = 6, 0
    assert b.query_start_loc[:4] == [0, 1, 2, 8] and set(b.query_start_loc[4:]) == {8}

    out = run_step(b, IMPLS[impl], device=TRITON_DEVICE if impl == "triton" else "cpu")
    assert out["positions"][:8].tolist() == [40, 17, 0, 1, 2, 3, 4, 5]
    assert out["seq_lens"][:4].tolist() == [41, 18, 6, 0]
    assert out["logits_view"].tolist() == [0, 1, 7]
    ids = out["input_ids"][:8].tolist()
    assert ids == [b.last_sampled[1023], b.last_sampled[1022]] + prompt
    slots = out["slots_view"].tolist()
    assert slots[0] == b.table[1023][2] * 16 + 8
    assert slots[2:8] == [b.table[1021][0] * 16 + k for k in range(6)]
    check(b, out)


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_host_sizes_are_validated(impl: str) -> None:
    f = IMPLS[impl]
    qsl = torch.zeros(5, dtype=torch.int32)
    idx = torch.zeros(4, dtype=torch.int32)
    ids = torch.zeros(8, dtype=torch.int32)
    with pytest.raises(ValueError, match="num_reqs"):
        f["pos"](idx, qsl, idx, torch.zeros(8, dtype=torch.int64), idx.clone(), 5)
    with pytest.raises(ValueError, match="logits_indices_out"):
        f["combine"](ids, idx, ids.long(), qsl, idx, idx, ids.long()[:1], 2)
    with pytest.raises(ValueError, match="num_tokens"):
        slot_mapping = torch.zeros(8, dtype=torch.int64)
        f["slots"](idx.view(4, 1), idx, qsl, ids.long(), 16, slot_mapping, 1, 4, 9)
    with pytest.raises(ValueError, match="block_size"):
        f["slots"](idx.view(4, 1), idx, qsl, ids.long(), 0, ids.long(), 1, 1, 1)
    with pytest.raises(ValueError, match="num_reqs_padded"):
        f["gather"](idx.view(4, 1), idx, idx.view(4, 1).clone(), 2, 5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_random_batches_on_cuda(block_size: int) -> None:
    """The public builders on CUDA tensors (compiled Triton kernels) against the oracle."""
    rng = random.Random(1000 * block_size)
    for case in range(8):
        num_reqs, num_tokens = random_sizes(rng, case)
        batch = make_batch(rng, block_size, num_reqs, num_tokens)
        public = builders(device_ops(torch.device("cuda")))
        check(batch, run_step(batch, public, last_2d=case % 2 == 1, device="cuda"))
