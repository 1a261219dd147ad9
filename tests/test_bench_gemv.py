"""The Triton GEMV candidate of benchmarks/bench_gemv.py against torch's matmul
(the interpreter on CPU, compiled with CUDA)."""

import pytest
import torch

from benchmarks.bench_gemv import skinny_matmul
from tests.kernel_device import KERNEL_DEVICE

DEVICE = KERNEL_DEVICE
# The Triton interpreter cannot run tl.dot on bfloat16 inputs: bf16 on CUDA only.
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,block_n,block_k", [(1, 40, 300, 16, 256), (8, 64, 512, 32, 256),
                                                   (5, 17, 96, 8, 512)])
def test_skinny_matmul_matches_torch(dtype, m, n, k, block_n, block_k):
    gen = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    got = skinny_matmul(x.to(DEVICE), w.to(DEVICE), BLOCK_N=block_n, BLOCK_K=block_k).cpu()
    want = x.double() @ w.double().T
    tol = 1e-3 if dtype == torch.float32 else 0.15  # bf16 output rounding over k terms
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
