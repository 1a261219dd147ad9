"""runner/layers/triton_qkv_rotary.py: the qkv projection, rotary and the KV
write of a decode batch in one launch, against the torch reference
(projection, ``rotary_ref``, ``write_kv``); the interpreter on CPU, compiled
with CUDA. The reference's own parts are checked against HF elsewhere
(test_layer_kernels.py, the model parity tests)."""

import pytest
import torch

from runner.layers.rotary import RotaryEmbedding, qkv_rotary_write_kv_ref
from runner.layers.triton_qkv_rotary import (
    BLOCK_P,
    qkv_rotary_write_kv,
    skinny_qkv_rotary_write_kv,
    uses_skinny_qkv_rotary,
)
from tests.helpers.kernel_device import KERNEL_DEVICE, kernel_dtypes

DEVICE = KERNEL_DEVICE
DTYPES = kernel_dtypes(torch.float32)
NUM_BLOCKS, BLOCK_SIZE = 6, 8


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=3e-2)


def _case(m, k, hq, hk, head_dim, dtype, seed):
    """Input rows, a fused qkv weight, positions, slots (one -1; with m > 2
    the last row has no slot_mapping entry at all, as in a padded graph
    batch) and a cache filled with a marker."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn((hq + 2 * hk) * head_dim, k, generator=gen) / k ** 0.5).to(dtype)
    positions = torch.randint(0, 200, (m,), generator=gen)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=gen)[:m]
    if m > 1:
        slots[1] = -1
    if m > 2:
        slots = slots[:-1]
    cache = torch.full((2, NUM_BLOCKS, BLOCK_SIZE, hk, head_dim), -7.0).to(dtype)
    return x, w, positions, slots, cache


def _run_both(fn, x, w, positions, slots, cache, rope, hq, hk, **kwargs):
    want_cache = cache.clone()
    want_q = qkv_rotary_write_kv_ref(x, w, positions, rope.cos, rope.sin, want_cache, slots,
                                     hq, hk)
    got_cache = cache.clone().to(DEVICE)
    got_q = fn(x.to(DEVICE), w.to(DEVICE), positions.to(DEVICE), rope.cos.to(DEVICE),
               rope.sin.to(DEVICE), got_cache, slots.to(DEVICE), hq, hk, **kwargs)
    return want_q, want_cache, got_q.cpu(), got_cache.cpu()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,hq,hk,head_dim,block_p,block_k", [
    (1, 96, 4, 2, 64, 16, 64),     # K a multiple of the tile
    (3, 200, 2, 1, 64, 32, 128),   # a masked last K tile; one slot -1, one row unmapped
    (8, 128, 4, 4, 128, 16, 128),  # head_dim 128, a pair block of a quarter head
    (12, 160, 2, 1, 64, 32, 64),   # four masked rows of the 16-row tile
    (16, 96, 4, 2, 64, 16, 64),    # the whole tile; the last row unmapped
])
def test_skinny_kernel_matches_reference(dtype, m, k, hq, hk, head_dim, block_p, block_k):
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None)
    case = _case(m, k, hq, hk, head_dim, dtype, seed=m * 31 + head_dim)
    want_q, want_cache, got_q, got_cache = _run_both(
        skinny_qkv_rotary_write_kv, *case, rope, hq, hk, block_p=block_p, block_k=block_k,
        num_stages=2)
    assert got_q.shape == (m, hq, head_dim)
    torch.testing.assert_close(got_q, want_q, **_tol(dtype))
    torch.testing.assert_close(got_cache, want_cache, **_tol(dtype))
    # Slots no row wrote keep the marker exactly.
    slots = case[3]
    written = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    assert torch.all(got_cache.flatten(1, 2)[:, ~written] == -7.0)


@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k_matches_reference_twice(split_k):
    """K read by split_k programs per pair group (a masked tail in the last
    split), the last of a group rotating and storing: the reference's q and
    cache, twice from the same counters, which end at 0."""
    from runner.layers.split_k import COUNTERS

    rope = RotaryEmbedding(64, 256, 10000.0, None)
    case = _case(5, 200, 2, 1, 64, torch.float32, seed=split_k)
    for _ in range(2):
        want_q, want_cache, got_q, got_cache = _run_both(
            skinny_qkv_rotary_write_kv, *case, rope, 2, 1, block_p=16, block_k=32,
            num_stages=2, split_k=split_k)
        torch.testing.assert_close(got_q, want_q, **_tol(torch.float32))
        torch.testing.assert_close(got_cache, want_cache, **_tol(torch.float32))
        assert not COUNTERS.at_least(8, DEVICE)[:8].any()


def test_dispatch_takes_the_rotary_kernel_for_small_projections():
    # Too few programs for the SMs: cuBLAS (here F.linear) and the rotary
    # kernel, with the same result as the reference.
    hq, hk, head_dim = 2, 1, 64
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None)
    case = _case(3, 64, hq, hk, head_dim, torch.float32, seed=5)
    assert not uses_skinny_qkv_rotary(case[0].to(DEVICE), case[1].to(DEVICE), head_dim)
    want_q, want_cache, got_q, got_cache = _run_both(qkv_rotary_write_kv, *case, rope, hq, hk)
    torch.testing.assert_close(got_q, want_q, **_tol(torch.float32))
    torch.testing.assert_close(got_cache, want_cache, **_tol(torch.float32))


def test_uses_skinny_qkv_rotary_on_decode_batches_of_model_sized_projections():
    def decide(rows, dtype, head_dim=128, out_rows=6144):
        x = torch.empty(rows, 4096, dtype=dtype)
        w = torch.empty(out_rows, 4096, dtype=dtype)
        return uses_skinny_qkv_rotary(x, w, head_dim)

    assert decide(1, torch.bfloat16) and decide(8, torch.float16)
    assert decide(16, torch.bfloat16)  # one 16-row tile
    assert not decide(17, torch.bfloat16)  # beyond it: cuBLAS's tiles
    assert not decide(1, torch.float32)  # the tensor cores' half precision only
    assert not decide(1, torch.bfloat16, head_dim=2 * BLOCK_P + 2)  # pairs must tile a half
    assert not decide(1, torch.bfloat16, out_rows=32 * BLOCK_P)  # 16 programs: too few SMs
    assert decide(1, torch.bfloat16, head_dim=64, out_rows=3072)  # a 1B shape: 48 programs


def test_rejects_a_weight_that_does_not_fit_the_heads():
    hq, hk, head_dim = 2, 1, 64
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None)
    x, w, positions, slots, cache = _case(1, 64, hq, hk, head_dim, torch.float32, seed=1)
    with pytest.raises(ValueError, match="does not fit"):
        skinny_qkv_rotary_write_kv(x, w[:-1], positions, rope.cos, rope.sin, cache, slots,
                                   hq, hk)


def test_rejects_more_rows_than_one_tile():
    hq, hk, head_dim = 2, 1, 64
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None)
    x, w, positions, slots, cache = _case(17, 64, hq, hk, head_dim, torch.float32, seed=2)
    with pytest.raises(ValueError, match="at most 16 rows, got 17"):
        skinny_qkv_rotary_write_kv(x, w, positions, rope.cos, rope.sin, cache, slots, hq, hk)
