"""The medium kernel's qkv + rotary + KV-write epilogue
(``triton_medium_matmul.medium_qkv_rotary_write_kv``) against the torch
reference (projection, ``rotary_ref``, ``write_kv``): the interpreter on
CPU, compiled with CUDA; and ``qkv_rotary_write_kv``'s routing by rows, the
switch and the config table."""

import pytest
import torch

import runner.layers.triton_medium_matmul as medium
import runner.layers.triton_qkv_rotary as qkv_rotary
from runner.layers.rotary import RotaryEmbedding, qkv_rotary_write_kv_ref
from runner.layers.split_k import COUNTERS
from runner.layers.triton_medium_matmul import medium_qkv_rotary_write_kv, uses_medium_qkv_rotary
from tests.helpers.kernel_device import KERNEL_DEVICE, kernel_dtypes

DEVICE = KERNEL_DEVICE
DTYPES = kernel_dtypes(torch.float32)
NUM_BLOCKS, BLOCK_SIZE = 10, 8  # 80 slots: room for 64 rows


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=3e-2)


def _case(rows, k, hq, hk, head_dim, dtype, seed):
    """Input rows, a fused qkv weight (q, k, v heads), positions, slots (two
    of them -1, and no entry for the last three rows, as in a padded graph
    batch) and a cache filled with a marker."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = (torch.randn((hq + 2 * hk) * head_dim, k, generator=gen) / k ** 0.5).to(dtype)
    positions = torch.randint(0, 200, (rows,), generator=gen)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=gen)[:rows - 3]
    slots[[1, rows // 2]] = -1
    cache = torch.full((2, NUM_BLOCKS, BLOCK_SIZE, hk, head_dim), -7.0).to(dtype)
    return x, w, positions, slots, cache


def _run_both(fn, case, rope, hq, hk, **config):
    """(reference q, reference cache, fn's q, fn's cache) from the same case."""
    x, w, positions, slots, cache = case
    want_cache = cache.clone()
    want_q = qkv_rotary_write_kv_ref(x, w, positions, rope.cos, rope.sin, want_cache, slots,
                                     hq, hk)
    got_cache = cache.clone().to(DEVICE)
    got_q = fn(x.to(DEVICE), w.to(DEVICE), positions.to(DEVICE), rope.cos.to(DEVICE),
               rope.sin.to(DEVICE), got_cache, slots.to(DEVICE), hq, hk, **config)
    return want_q, want_cache, got_q.cpu(), got_cache.cpu()


def _counters_at_zero():
    return not COUNTERS.at_least(8, DEVICE)[:8].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [17, 33, 64])
@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize("k,hq,hk,head_dim,block_p,block_k", [
    (200, 4, 2, 64, 16, 64),   # GQA; two programs a half head; a masked last K tile
    (96, 2, 1, 128, 32, 32),   # head_dim 128; K a multiple of the tile
])
def test_matches_reference_twice(dtype, rows, split_k, k, hq, hk, head_dim, block_p, block_k):
    """q heads rotated into q, k heads rotated and v heads into the cache at
    their slots (slots -1 and unmapped rows store nothing, their slots keep
    the marker); each split of K; twice from the same counters, which end
    at 0."""
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None)
    case = _case(rows, k, hq, hk, head_dim, dtype, seed=rows * 7 + split_k + head_dim)
    for _ in range(2):
        want_q, want_cache, got_q, got_cache = _run_both(
            medium_qkv_rotary_write_kv, case, rope, hq, hk, block_p=block_p, block_k=block_k,
            split_k=split_k, num_warps=4, num_stages=2)
        assert got_q.shape == (rows, hq, head_dim) and got_q.dtype == dtype
        torch.testing.assert_close(got_q, want_q, **_tol(dtype))
        torch.testing.assert_close(got_cache, want_cache, **_tol(dtype))
        assert _counters_at_zero()
    slots = case[3]
    written = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    assert torch.all(got_cache.flatten(1, 2)[:, ~written] == -7.0)
    assert torch.all(got_cache.flatten(1, 2)[:, written] != -7.0)


def test_default_config_and_chosen_split():
    """No config arguments: the "qkv_rotary" default (32 pairs a program,
    the split ``choose_split_k`` picks)."""
    dtype = DTYPES[-1]
    hq, hk, head_dim = 2, 1, 64
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None)
    case = _case(24, 256, hq, hk, head_dim, dtype, seed=11)
    want_q, want_cache, got_q, got_cache = _run_both(medium_qkv_rotary_write_kv, case, rope,
                                                     hq, hk)
    torch.testing.assert_close(got_q, want_q, **_tol(dtype))
    torch.testing.assert_close(got_cache, want_cache, **_tol(dtype))


def _record_routes(monkeypatch) -> list:
    """Replace the three paths of ``qkv_rotary_write_kv`` by recorders that
    return the reference's q."""
    taken = []

    def recorder(name):
        def record(*args, **norm):
            if name == "unfused":
                matmul, args = args[0], args[1:]
                taken.append((name, matmul))
            else:
                taken.append(name)
            return qkv_rotary_write_kv_ref(*args, **norm)
        return record

    for name in ("skinny", "medium", "unfused"):
        monkeypatch.setattr(qkv_rotary, f"{name}_qkv_rotary_write_kv", recorder(name))
    return taken


def _route(rows, hq=32, hk=8, head_dim=128, k=64):
    """``qkv_rotary_write_kv`` on bf16 zeros of an 8B-sized head layout."""
    x = torch.zeros(rows, k, dtype=torch.bfloat16)
    w = torch.zeros((hq + 2 * hk) * head_dim, k, dtype=torch.bfloat16)
    cos = torch.zeros(rows, head_dim // 2)
    cache = torch.zeros(2, 10, 8, hk, head_dim, dtype=torch.bfloat16)
    qkv_rotary.qkv_rotary_write_kv(x, w, torch.arange(rows), cos, cos, cache,
                                   torch.arange(rows), hq, hk)
    return x, w


def test_routing_by_rows_the_switch_and_the_table(monkeypatch):
    """16 rows: the skinny fused launch; 17..64: the medium fused launch;
    65: the projection (cuBLAS there) then the rotary kernel. With the
    switch off, or the table sending the shape to None, 17..64 rows take
    the unfused pair too."""
    taken = _record_routes(monkeypatch)
    for rows in (16, 17, 64):
        _route(rows)
    x, w = _route(65)
    assert taken == ["skinny", "medium", "medium", ("unfused", medium.medium_or_cublas)]
    assert not medium.uses_medium_matmul(x, w)  # 65 rows: cuBLAS's projection
    taken.clear()
    monkeypatch.setattr(medium, "MEDIUM_MATMUL_ENABLED", False)
    _route(32)
    monkeypatch.setattr(medium, "MEDIUM_MATMUL_ENABLED", True)
    monkeypatch.setitem(medium.TUNED_CONFIGS, ("qkv_rotary", 6144, 64, 64), None)
    _route(40)
    _route(32)  # M_PAD 32: still the default config
    assert taken == [("unfused", medium.medium_or_cublas)] * 2 + ["medium"]


def test_uses_medium_qkv_rotary():
    def decide(rows, dtype=torch.bfloat16, head_dim=128):
        x = torch.empty(rows, 64, dtype=dtype)
        w = torch.empty(48 * head_dim, 64, dtype=dtype)
        return uses_medium_qkv_rotary(x, w, head_dim)

    assert decide(17) and decide(64) and decide(40, torch.float16)
    assert decide(33, head_dim=64)  # the 1B shape: one program a half head
    assert not decide(16) and not decide(65)
    assert not decide(32, torch.float32)  # half precision only
    assert not decide(32, head_dim=96)  # 32 pairs do not tile a half of 48


def test_table_config_is_taken(monkeypatch):
    """A tuned config replaces the default; arguments replace both."""
    monkeypatch.setitem(medium.TUNED_CONFIGS, ("qkv_rotary", 256, 64, 32),
                        dict(block_p=16, block_k=32, split_k=2, num_warps=4, num_stages=2))
    assert medium.medium_config("qkv_rotary", 256, 64, 20)["block_p"] == 16
    w = torch.zeros(256, 64)
    assert medium._config("qkv_rotary", w, 20, dict(block_k=64))["block_k"] == 64
    hq, hk, head_dim = 2, 1, 64  # 256 weight rows over K 64
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None)
    case = _case(20, 64, hq, hk, head_dim, torch.float32, seed=4)
    want_q, want_cache, got_q, got_cache = _run_both(medium_qkv_rotary_write_kv, case, rope,
                                                     hq, hk)
    torch.testing.assert_close(got_q, want_q, **_tol(torch.float32))
    torch.testing.assert_close(got_cache, want_cache, **_tol(torch.float32))
    assert _counters_at_zero()


def test_rejects_inputs_it_cannot_take():
    hq, hk, head_dim = 2, 1, 64
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None)

    def call(rows=20, weight_rows=None, k=64, block_p=None, cache=None):
        x = torch.zeros(rows, k, device=DEVICE)
        w = torch.zeros(weight_rows or (hq + 2 * hk) * head_dim, 64, device=DEVICE)
        if cache is None:
            cache = torch.zeros(2, 4, 8, hk, head_dim, device=DEVICE)
        medium_qkv_rotary_write_kv(x, w, torch.zeros(rows, dtype=torch.long, device=DEVICE),
                                   rope.cos.to(DEVICE), rope.sin.to(DEVICE), cache,
                                   torch.zeros(rows, dtype=torch.long, device=DEVICE), hq, hk,
                                   block_p=block_p)

    with pytest.raises(ValueError, match="at most 64 rows, got 65"):
        call(rows=65)
    with pytest.raises(ValueError, match="does not fit"):
        call(weight_rows=200)
    with pytest.raises(ValueError, match="does not fit"):
        call(k=32)
    with pytest.raises(ValueError, match=r"head_dim 64 is not a multiple of 2 \* block_p \(64\)"):
        call(block_p=64)
    with pytest.raises(ValueError, match="needs unit last strides"):
        call(cache=torch.zeros(2, 4, 8, hk, 2 * head_dim, device=DEVICE)[..., ::2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [17, 32, 48, 64])
@pytest.mark.parametrize("hq,hk,head_dim,k", [(32, 8, 128, 4096), (32, 8, 64, 2048)])
def test_model_shapes_on_cuda_match_the_reference(rows, hq, hk, head_dim, k):
    """The 8B and 1B qkv shapes in bf16 at the default config and through
    the runner's route, q and cache equal to the reference's."""
    rope = RotaryEmbedding(head_dim, 256, 500000.0, None)
    case = _case(rows, k, hq, hk, head_dim, torch.bfloat16, seed=rows)
    for fn in (medium_qkv_rotary_write_kv, qkv_rotary.qkv_rotary_write_kv):
        want_q, want_cache, got_q, got_cache = _run_both(fn, case, rope, hq, hk)
        torch.testing.assert_close(got_q, want_q, **_tol(torch.bfloat16))
        torch.testing.assert_close(got_cache, want_cache, **_tol(torch.bfloat16))
