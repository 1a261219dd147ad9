"""The Triton skinny matmul of benchmarks/bench_gemv.py against torch: the plain
product and the fused SiLU-and-multiply input (the interpreter on CPU, compiled
with CUDA), so the benchmark times a kernel that computes the right thing."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.bench_gemv import skinny_matmul
from tests.kernel_device import KERNEL_DEVICE

DEVICE = KERNEL_DEVICE
# The Triton interpreter cannot run tl.dot on bfloat16 inputs: bf16 on CUDA only.
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])
SHAPES = [(1, 40, 300, 16, 256), (8, 64, 512, 32, 256), (5, 17, 96, 8, 512), (16, 33, 700, 32, 256)]


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,block_n,block_k", SHAPES)
def test_fused_silu_mul_input_matches_two_step_torch(dtype, m, n, k, block_n, block_k):
    gen = torch.Generator().manual_seed(7 * m + n)
    gate_up = (2 * torch.randn(m, 2 * k, generator=gen)).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    activated = F.silu(gate) * up  # rounded to dtype, as the kernel rounds it
    want = activated.double() @ w.double().T
    got = skinny_matmul(gate_up.to(DEVICE), w.to(DEVICE), silu_mul=True,
                        block_n=block_n, block_k=block_k).cpu()
    torch.testing.assert_close(got.double(), want, rtol=_tol(dtype), atol=_tol(dtype))


def test_rejects_shapes_it_cannot_take():
    x = torch.zeros(17, 8, device=DEVICE)
    with pytest.raises(ValueError, match="at most 16 rows"):
        skinny_matmul(x, torch.zeros(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="gate\\|up"):
        skinny_matmul(torch.zeros(2, 8, device=DEVICE), torch.zeros(4, 8, device=DEVICE),
                      silu_mul=True)
