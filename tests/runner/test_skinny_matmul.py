"""runner/layers/triton_skinny_matmul.py against torch (the interpreter on CPU,
compiled with CUDA), the row-parallel layer that takes it for decode
batches on CUDA, and the MLP's gate/up projection with SiLU in the epilogue."""

import pytest
import torch

from runner.layers.activation import gate_up_silu_ref
from runner.layers.triton_skinny_matmul import (
    gate_up_silu,
    skinny_gate_up_silu,
    skinny_matmul,
    uses_skinny_matmul,
)
from tests.helpers.kernel_device import KERNEL_DEVICE, kernel_dtypes

DEVICE = KERNEL_DEVICE
DTYPES = kernel_dtypes(torch.float32)
# 12 rows: four masked rows of the 16-row tile; 16 rows: the whole tile.
SHAPES = [(1, 40, 300, 16, 256), (8, 64, 512, 32, 256), (5, 17, 96, 8, 512), (16, 33, 700, 32, 256),
          (12, 70, 260, 32, 128)]


def _tol(dtype):
    # bf16: the output's rounding over k terms.
    return 1e-3 if dtype == torch.float32 else 0.15


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,block_n,block_k", SHAPES)
def test_skinny_matmul_matches_torch(dtype, m, n, k, block_n, block_k):
    gen = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    got = skinny_matmul(x.to(DEVICE), w.to(DEVICE), block_n=block_n, block_k=block_k).cpu()
    want = x.double() @ w.double().T
    torch.testing.assert_close(got.double(), want, rtol=_tol(dtype), atol=_tol(dtype))


@pytest.mark.parametrize("split_k", [2, 3, 4])
def test_split_k_matches_torch_and_leaves_its_counters_at_zero(split_k):
    """K read by split_k programs per column group (the last of a group sums
    the parts): equal to the one-program kernel within float32 rounding,
    twice in a row from the same counters, which end at 0. 700 columns in
    tiles of 64: every split count leaves the last split a masked tail."""
    from runner.layers.split_k import COUNTERS

    gen = torch.Generator().manual_seed(split_k)
    x = torch.randn(7, 700, generator=gen)
    w = torch.randn(75, 700, generator=gen)
    want = x.double() @ w.double().T
    one = skinny_matmul(x.to(DEVICE), w.to(DEVICE), block_n=32, block_k=64, split_k=1).cpu()
    for _ in range(2):
        got = skinny_matmul(x.to(DEVICE), w.to(DEVICE), block_n=32, block_k=64,
                            split_k=split_k).cpu()
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(got, one, rtol=1e-5, atol=1e-4)
        assert not COUNTERS.at_least(3, DEVICE)[:3].any()


def test_choose_split_k_fills_the_sms_within_limits():
    from runner.layers.split_k import choose_split_k

    assert choose_split_k(128, 4096, 512, 132) == 1  # 8B o_proj: a program an SM already
    assert choose_split_k(64, 2048, 512, 132) == 2  # 1B o_proj: twice the programs
    assert choose_split_k(48, 2048, 256, 132) == 2  # 1B qkv: 132 // 48
    assert choose_split_k(16, 8192, 512, 132) == 4  # at most MAX_SPLIT_K
    assert choose_split_k(16, 1024, 512, 132) == 1  # two tiles: a split needs at least two


def test_rejects_shapes_it_cannot_take():
    x = torch.zeros(17, 8, device=DEVICE)
    with pytest.raises(ValueError, match="at most 16 rows"):
        skinny_matmul(x, torch.zeros(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="does not fit weight"):
        skinny_matmul(torch.zeros(2, 16, device=DEVICE), torch.zeros(4, 8, device=DEVICE))


def test_dispatch_only_for_small_half_precision_cuda_batches_with_wide_outputs():
    import torch.nn.functional as F

    from runner.ops import device_ops

    wide = torch.zeros(4096, 8, dtype=torch.bfloat16)
    assert device_ops(torch.device("cpu")).row_parallel_matmul is F.linear  # CPU: never skinny
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        wide, narrow = wide.to(cuda), torch.zeros(256, 8, dtype=torch.bfloat16, device=cuda)
        assert uses_skinny_matmul(torch.zeros(8, 8, dtype=torch.bfloat16, device=cuda), wide)
        assert not uses_skinny_matmul(torch.zeros(8, 8, dtype=torch.bfloat16, device=cuda), narrow)
        assert uses_skinny_matmul(torch.zeros(16, 8, dtype=torch.bfloat16, device=cuda), wide)
        assert not uses_skinny_matmul(torch.zeros(17, 8, dtype=torch.bfloat16, device=cuda), wide)
        assert not uses_skinny_matmul(torch.zeros(1, 8, dtype=torch.float32, device=cuda),
                                      wide.float())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 8, 12, 16, 17])
def test_row_parallel_layer_on_cuda_matches_float64(rows):
    """o_proj / down as the model calls them, in bf16, 4096 outputs (the 8B
    shape's): the skinny path (rows <= 16) and cuBLAS (17 rows) both match the
    float64 product."""
    from runner.distributed import TensorParallelGroup
    from runner.layers import RowParallelLinear

    gen = torch.Generator().manual_seed(rows)
    with torch.device("cuda"):  # as the model is built: its device picks the layer's ops
        layer = RowParallelLinear(1024, 4096, TensorParallelGroup(), False, torch.bfloat16)
    weight = torch.randn(4096, 1024, generator=gen) / 1024 ** 0.5
    layer.weight.data.copy_(weight)
    x = torch.randn(rows, 1024, generator=gen).to(torch.bfloat16)
    want = x.double() @ layer.weight.cpu().double().T
    assert uses_skinny_matmul(x.cuda(), layer.weight) == (rows <= 16)
    got = layer(x.cuda()).cpu().double()
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,block_n,block_k", SHAPES)
def test_gate_up_silu_matches_the_unfused_reference(dtype, m, n, k, block_n, block_k):
    """n outputs from 2n weight rows (gate, then up): the fused kernel equals
    the projection followed by silu(gate) * up; n not a multiple of the tile."""
    gen = torch.Generator().manual_seed(m * n + k + 1)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(2 * n, k, generator=gen) / k ** 0.5).to(dtype)
    got = skinny_gate_up_silu(x.to(DEVICE), w.to(DEVICE), block_n=block_n,
                              block_k=block_k).cpu()
    assert got.shape == (m, n)
    gate, up = (x.double() @ w.double().T).chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    torch.testing.assert_close(got.double(), want, rtol=_tol(dtype), atol=_tol(dtype) / 10)
    if dtype == torch.float32:  # the reference the CPU path runs
        torch.testing.assert_close(got, gate_up_silu_ref(x, w), rtol=1e-4, atol=1e-5)


def test_gate_up_silu_rejects_shapes_it_cannot_take():
    with pytest.raises(ValueError, match="at most 16 rows"):
        skinny_gate_up_silu(torch.zeros(17, 8, device=DEVICE), torch.zeros(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="does not fit weight"):
        skinny_gate_up_silu(torch.zeros(2, 8, device=DEVICE), torch.zeros(5, 8, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 8, 12, 16, 17])
def test_gate_up_silu_on_cuda_matches_float64(rows):
    """The 8B MLP's 14336 outputs in bf16: one fused launch (rows <= 16) and
    cuBLAS + the activation kernel (17 rows) both match float64."""
    gen = torch.Generator().manual_seed(rows)
    w = (torch.randn(2 * 14336, 1024, generator=gen) / 1024 ** 0.5).to(torch.bfloat16)
    x = torch.randn(rows, 1024, generator=gen).to(torch.bfloat16)
    gate, up = (x.double() @ w.double().T).chunk(2, dim=-1)
    got = gate_up_silu(x.cuda(), w.cuda()).cpu().double()
    torch.testing.assert_close(got, torch.nn.functional.silu(gate) * up, rtol=0.02, atol=0.02)
