"""runner/layers/triton_medium_matmul.py against torch (the interpreter on
CPU, compiled with CUDA): the plain matmul and the gate/up + SiLU epilogue
for 17..64 rows, split over K or not, with pointer or TMA weight tiles, and
the runner's routing of 16 / 17..64 / 65 rows."""

import types

import pytest
import torch
import torch.nn.functional as F

import runner.layers.triton_medium_matmul as medium
import runner.layers.triton_skinny_matmul as skinny
from runner.layers.activation import gate_up_silu_ref
from runner.layers.split_k import COUNTERS
from runner.layers.triton_medium_matmul import medium_gate_up_silu, medium_matmul
from tests.helpers.kernel_device import KERNEL_DEVICE, kernel_dtypes

DEVICE = KERNEL_DEVICE
DTYPES = kernel_dtypes(torch.float32)
# 70 outputs: a masked tail of every BLOCK_N; 300 columns: a masked tail of every BLOCK_K.
N, K = 70, 300


def _tol(dtype):
    # bf16: the output's rounding over k terms.
    return 1e-3 if dtype == torch.float32 else 0.15


def _counters_at_zero():
    return not COUNTERS.at_least(8, DEVICE)[:8].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [2, 8, 17, 32, 33, 64])
@pytest.mark.parametrize("split_k", [1, 2, 3])
def test_medium_matmul_matches_torch(dtype, rows, split_k):
    """Every row count's padding (32 or 64; 2 and 8 rows, the LM head's
    smallest medium batches, pad to 32), each split of K; twice from the
    same counters, which end at 0."""
    gen = torch.Generator().manual_seed(rows * 10 + split_k)
    x = torch.randn(rows, K, generator=gen).to(dtype)
    w = torch.randn(N, K, generator=gen).to(dtype)
    want = x.double() @ w.double().T
    for _ in range(2):
        got = medium_matmul(x.to(DEVICE), w.to(DEVICE), block_n=32, block_k=64,
                            split_k=split_k, num_warps=4, num_stages=2).cpu()
        assert got.shape == (rows, N) and got.dtype == dtype
        torch.testing.assert_close(got.double(), want, rtol=_tol(dtype), atol=_tol(dtype))
        assert _counters_at_zero()


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("block_n,block_k,split_k", [(64, 64, 1), (32, 128, 2), (16, 32, 4)])
def test_tiles_and_tma_agree_with_torch(tma, block_n, block_k, split_k):
    """Weight tiles through pointers or a [1, N, K] descriptor (zero past N
    and K) give the same product; tiles wider than N, several splits."""
    gen = torch.Generator().manual_seed(block_n + split_k)
    x = torch.randn(40, K, generator=gen).to(DEVICE)
    w = torch.randn(N, K, generator=gen).to(DEVICE)
    got = medium_matmul(x, w, block_n=block_n, block_k=block_k, split_k=split_k, tma=tma)
    torch.testing.assert_close(got.cpu().double(), x.cpu().double() @ w.cpu().double().T,
                               rtol=1e-3, atol=1e-3)
    assert _counters_at_zero()


def test_default_config_and_chosen_split():
    """No tile arguments: the default table's config and ``choose_split_k``."""
    gen = torch.Generator().manual_seed(5)
    dtype = DTYPES[-1]  # the default tiles are sized for half precision (bf16 on CUDA)
    x = torch.randn(20, 512, generator=gen).to(dtype)
    w = (torch.randn(192, 512, generator=gen) / 512 ** 0.5).to(dtype)
    got = medium_matmul(x.to(DEVICE), w.to(DEVICE)).cpu()
    torch.testing.assert_close(got.double(), x.double() @ w.double().T, rtol=_tol(dtype),
                               atol=_tol(dtype) / 10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n,k,split_k,tma", [(17, 70, 300, 1, False), (33, 40, 256, 2, False),
                                                  (64, 70, 304, 3, True), (24, 16, 96, 1, True)])
def test_gate_up_silu_matches_the_unfused_reference(dtype, rows, n, k, split_k, tma):
    """n outputs from 2n weight rows (gate, then up), one [2, BLOCK_N, BLOCK_K]
    tile a step: equal to the projection followed by silu(gate) * up."""
    gen = torch.Generator().manual_seed(rows + n + split_k)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = (torch.randn(2 * n, k, generator=gen) / k ** 0.5).to(dtype)
    for _ in range(2):
        got = medium_gate_up_silu(x.to(DEVICE), w.to(DEVICE), block_n=32, block_k=64,
                                  split_k=split_k, num_stages=2, tma=tma).cpu()
        assert got.shape == (rows, n)
        gate, up = (x.double() @ w.double().T).chunk(2, dim=-1)
        torch.testing.assert_close(got.double(), F.silu(gate) * up, rtol=_tol(dtype),
                                   atol=_tol(dtype) / 10)
        if dtype == torch.float32:  # the reference the CPU path runs
            torch.testing.assert_close(got, gate_up_silu_ref(x, w), rtol=1e-4, atol=1e-5)
        assert _counters_at_zero()


def test_rejects_inputs_it_cannot_take():
    x = torch.zeros(65, 8, device=DEVICE)
    with pytest.raises(ValueError, match="at most 64 rows, got 65"):
        medium_matmul(x, torch.zeros(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="at most 64 rows"):
        medium_gate_up_silu(x, torch.zeros(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="does not fit weight"):
        medium_matmul(torch.zeros(20, 16, device=DEVICE), torch.zeros(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="does not fit weight"):
        medium_gate_up_silu(torch.zeros(20, 8, device=DEVICE), torch.zeros(5, 8, device=DEVICE))
    with pytest.raises(ValueError, match="unit last strides"):
        medium_matmul(torch.zeros(20, 8, device=DEVICE).T.contiguous().T,
                      torch.zeros(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="16-byte aligned rows"):  # 300 bf16: 600 bytes a row
        medium_matmul(torch.zeros(20, 300, dtype=torch.bfloat16, device=DEVICE),
                      torch.zeros(4, 300, dtype=torch.bfloat16, device=DEVICE), tma=True)


def test_m_pad_and_config_table(monkeypatch):
    assert [medium.m_pad(r) for r in (17, 32, 33, 64)] == [32, 32, 64, 64]
    monkeypatch.setitem(medium.TUNED_CONFIGS, ("matmul", 4096, 4096, 64), None)
    monkeypatch.setitem(medium.TUNED_CONFIGS, ("gate_up", 256, 64, 32), dict(block_n=16))
    assert medium.medium_config("matmul", 4096, 4096, 40) is None
    assert medium.medium_config("matmul", 1024, 1024, 32) == medium.DEFAULT_CONFIGS["matmul"]
    assert medium.medium_config("gate_up", 256, 64, 20) == dict(block_n=16)


def _record_routes(monkeypatch) -> list[str]:
    """Replace every kernel the routing can pick by a recorder of its name
    that returns the torch product."""
    taken = []

    def recorder(name, fn):
        def record(x, w, *args, **kwargs):
            taken.append(name)
            return fn(x.float(), w.float()).to(x.dtype)
        return record

    def gate_up(x, w):
        return gate_up_silu_ref(x, w)

    monkeypatch.setattr(skinny, "skinny_matmul", recorder("skinny", F.linear))
    monkeypatch.setattr(medium, "medium_matmul", recorder("medium", F.linear))
    monkeypatch.setattr(medium, "F", types.SimpleNamespace(linear=recorder("cublas", F.linear)))
    monkeypatch.setattr(skinny, "skinny_gate_up_silu", recorder("skinny", gate_up))
    monkeypatch.setattr(skinny, "medium_gate_up_silu", recorder("medium", gate_up))
    monkeypatch.setattr(skinny, "cublas_gate_up_silu", recorder("cublas", gate_up))
    return taken


def test_routing_by_rows_and_the_switch(monkeypatch):
    """The runner's row-parallel and gate/up ops (8B widths, bf16): 16 rows to
    the skinny kernels, 17..64 to the medium ones, 65 to cuBLAS; with
    MEDIUM_MATMUL_ENABLED off, 17..64 to cuBLAS too."""
    taken = _record_routes(monkeypatch)
    weight = torch.zeros(4096, 64, dtype=torch.bfloat16)
    gate_up = torch.zeros(2 * 4096, 64, dtype=torch.bfloat16)
    for rows in (16, 17, 64, 65):
        x = torch.zeros(rows, 64, dtype=torch.bfloat16)
        skinny.row_parallel_matmul(x, weight)
        skinny.gate_up_silu(x, gate_up)
    assert taken == ["skinny"] * 2 + ["medium"] * 4 + ["cublas"] * 2
    taken.clear()
    monkeypatch.setattr(medium, "MEDIUM_MATMUL_ENABLED", False)
    skinny.row_parallel_matmul(torch.zeros(32, 64, dtype=torch.bfloat16), weight)
    skinny.gate_up_silu(torch.zeros(32, 64, dtype=torch.bfloat16), gate_up)
    assert taken == ["cublas", "cublas"]


def test_routing_needs_half_precision_and_untuned_shapes(monkeypatch):
    weight = torch.zeros(4096, 64, dtype=torch.bfloat16)
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    assert medium.uses_medium_matmul(x, weight)
    assert not medium.uses_medium_matmul(x.float(), weight.float())
    monkeypatch.setitem(medium.TUNED_CONFIGS, ("matmul", 4096, 64, 32), None)
    assert not medium.uses_medium_matmul(x, weight)
    assert medium.uses_medium_matmul(torch.zeros(33, 64, dtype=torch.bfloat16), weight)


def test_qkv_projection_of_medium_batches_takes_the_medium_kernel(monkeypatch):
    """qkv for 17..64 rows where the fused launch is tuned off (None for
    "qkv_rotary"): the medium matmul, then the rotary kernel; the rotated q
    and the cache equal the torch reference's."""
    from runner.layers.rotary import RotaryEmbedding, qkv_rotary_write_kv_ref
    from runner.layers.triton_qkv_rotary import qkv_rotary_write_kv

    taken = _record_routes(monkeypatch)
    hq, hk, head_dim, rows = 4, 2, 64, 20
    monkeypatch.setitem(medium.TUNED_CONFIGS, ("qkv_rotary", (hq + 2 * hk) * head_dim, 64, 32),
                        None)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(rows, 64, generator=gen).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn((hq + 2 * hk) * head_dim, 64, generator=gen) / 8).to(torch.bfloat16).to(DEVICE)
    rope = RotaryEmbedding(head_dim, 64, 10000.0, None).to(DEVICE)
    positions = torch.arange(rows, device=DEVICE)
    slots = torch.arange(rows, device=DEVICE)
    caches = [torch.zeros(2, 4, 8, hk, head_dim, dtype=torch.bfloat16, device=DEVICE)
              for _ in range(2)]
    got = qkv_rotary_write_kv(x, w, positions, rope.cos, rope.sin, caches[0], slots, hq, hk)
    want = qkv_rotary_write_kv_ref(x, w, positions, rope.cos, rope.sin, caches[1], slots, hq, hk)
    assert taken == ["medium"]
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02)
    torch.testing.assert_close(caches[0], caches[1], rtol=0.02, atol=0.02)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [17, 32, 48, 64])
def test_8b_shapes_on_cuda_match_float64(rows):
    """The 8B shapes in bf16 match float64: qkv, o_proj and down through the
    medium kernel at the shape's config (the default where the table sends
    the shape to cuBLAS) and through the runner's route; gate/up + SiLU
    through ``gate_up_silu`` and the medium kernel with and without TMA."""
    gen = torch.Generator().manual_seed(rows)
    for n, k in ((6144, 4096), (4096, 4096), (4096, 14336)):
        w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(torch.bfloat16)
        x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        want = x.double() @ w.double().T
        for op in (medium_matmul, skinny.row_parallel_matmul):
            got = op(x.cuda(), w.cuda()).cpu().double()
            torch.testing.assert_close(got, want, rtol=0.02, atol=0.02)
    w = (torch.randn(2 * 14336, 4096, generator=gen) / 64).to(torch.bfloat16)
    x = torch.randn(rows, 4096, generator=gen).to(torch.bfloat16)
    gate, up = (x.double() @ w.double().T).chunk(2, dim=-1)
    got = skinny.gate_up_silu(x.cuda(), w.cuda()).cpu().double()
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=0.02, atol=0.02)
    for tma in (False, True):
        fused = medium_gate_up_silu(x.cuda(), w.cuda(), tma=tma).cpu()
        torch.testing.assert_close(fused, gate_up_silu_ref(x.cuda(), w.cuda()).cpu(),
                                   rtol=0.02, atol=0.02)
