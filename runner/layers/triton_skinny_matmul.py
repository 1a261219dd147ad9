"""Triton matmul for a few rows (decode batches): out = x @ w.T, one pass over w.

At batch 1-8 a projection is a matrix-vector product bound by reading the
weight once. cuBLAS splits K for the row-parallel projections (o_proj, down)
and then launches a second kernel to reduce the splits; this kernel gives
each program BLOCK_N output columns and the whole of K instead, so there is
one launch and no partial sums in memory. With ``silu_mul`` the input is the
fused gate|up projection [M, 2K] and the program computes silu(gate) * up
while loading it: the MLP's SiLU launch disappears too.

Rounding matches the two-launch path: silu(gate) is rounded to the input
dtype, then silu * up is rounded again (``triton_silu_mul.py``), before the
product with w accumulates in float32. Rows are padded to 16 for the tensor
cores (M <= SKINNY_MAX_ROWS).

Measured on an H200 (benchmarks/bench_gemv.py, Llama-3.1-8B shapes, M=1): o_proj
11.3 us against cuBLAS's 12.5 us; down 30.4 against 30.7 us plus the SiLU
launch; qkv and gate_up stay on cuBLAS, which reads them faster.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

SKINNY_MAX_ROWS = 8
BLOCK_K = 512
SKINNY_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _skinny_matmul_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_x, stride_w, stride_out,
                          SILU_MUL: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    """out[m, n] = sum_k a[m, k] w[n, k] for BLOCK_N columns and every row, where
    a = x, or a = silu(x[:, :K]) * x[:, K:] with SILU_MUL."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, M_PAD)
    row_mask = rows < M
    col_mask = cols < N
    acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x_mask = row_mask[:, None] & (ks[None, :] < K)
        x_off = rows[:, None] * stride_x + ks[None, :]
        a = tl.load(x_ptr + x_off, mask=x_mask, other=0.0)
        if SILU_MUL:
            gate = a.to(tl.float32)
            up = tl.load(x_ptr + x_off + K, mask=x_mask, other=0.0).to(tl.float32)
            silu = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)
            a = (silu * up).to(x_ptr.dtype.element_ty)
        w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + ks[None, :],
                    mask=col_mask[:, None] & (ks[None, :] < K), other=0.0)
        acc += tl.dot(a, tl.trans(w))
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_block_n(n: int, device: torch.device) -> int:
    """Widest column block (32, 16 or 8) that still gives about one program
    per SM; narrower blocks only for small N (e.g. the 1B shape's 2048)."""
    if device.type != "cuda":
        return 16
    busy = 3 * _num_sms(device.index or 0) // 4
    for block_n in (32, 16):
        if triton.cdiv(n, block_n) >= busy:
            return block_n
    return 8


def skinny_matmul(x: torch.Tensor, w: torch.Tensor, silu_mul: bool = False,
                  block_n: int | None = None, block_k: int = BLOCK_K,
                  num_warps: int = 4) -> torch.Tensor:
    """x [M, K] @ w[N, K].T for M <= 16 rows; with ``silu_mul`` x is [M, 2K]
    (gate then up) and the product uses silu(gate) * up. Unit last strides."""
    m = x.shape[0]
    n, k = w.shape
    if m > 16:
        raise ValueError(f"skinny_matmul takes at most 16 rows, got {m}")
    if x.shape[1] != (2 * k if silu_mul else k):
        raise ValueError(f"input width {x.shape[1]} does not fit weight {tuple(w.shape)}"
                         f"{' (gate|up: 2K)' if silu_mul else ''}")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("skinny_matmul needs unit last strides")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_n = block_n or choose_block_n(n, x.device)
    _skinny_matmul_kernel[(triton.cdiv(n, block_n),)](
        x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        SILU_MUL=silu_mul, M_PAD=16, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    return out


def uses_skinny_matmul(x: torch.Tensor) -> bool:
    """Whether a projection of ``x`` takes the skinny kernel: CUDA, half
    precision, at most SKINNY_MAX_ROWS rows (decode batches up to 8), unit
    last stride."""
    return (x.is_cuda and x.dtype in SKINNY_DTYPES and x.shape[0] <= SKINNY_MAX_ROWS
            and x.stride(-1) == 1)
