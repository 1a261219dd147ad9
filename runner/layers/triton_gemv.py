"""One-row products streamed through registers: the 1B's o projection and the LM head.

The skinny kernel (``triton_skinny_matmul.py``) feeds ``tl.dot``, whose
smallest tile has 16 rows: at batch 1 fifteen rows of its input tile are
padding, and its pipeline, which stages weight and input tiles in shared
memory, fills most of an SM, so one program an SM streams the weight. Here
a program computes BLOCK_N outputs of the one row as float32 multiply-adds
on the weight tiles as they arrive in registers: each loop step issues the
load of the next BLOCK_K-wide tile before it reduces the current one (a
double buffer held in registers), the input row is a vector, and no shared
memory is used, so several programs share an SM and more of the weight is
in flight.

Where it runs. ``uses_gemv``: one row of an input at most GEMV_MAX_K wide,
the decoder's o projection at the 1B shape, in the place of
``skinny_matmul_add`` (the producer of ``norm_in_matmul.py``). In the decode
step it won there and lost at the 8B shape's o projection (4096 wide), its
down projections and, in a gate/up variant, both gate/up projections: the
projection's programs, launched early under programmatic dependent launch,
then share SMs with the kernel before them. ``gemv``: the LM head of one
row (``triton_skinny_matmul.lm_head_matmul`` routes it), in the place of
cuBLAS, which reads the table no faster and issues a memset before its
GEMM that the graph runs as a launch of its own.
(``benchmarks/results/README.md`` has the A/Bs.)

Arithmetic. Each output is a float32 sum over K rounded once: the o
projection's is then added to the residual as ``add_residual_and_store_parts``
adds the skinny kernel's (the parts are one per BLOCK_N column group), the
LM head's is the logit in the weight's dtype, as ``F.linear`` rounds it. Only
the order of the sum over K differs.

Both launch with programmatic dependent launch where the device has it
(``runner/triton_dependent_launch.py``) and let the next kernel start once
their loads are issued, as the skinny producer does. With EARLY each
program loads its first weight tile before it waits for the kernel before
it: the weight is constant, and that kernel (before the o projection the
decode attention, which leaves most of the memory bandwidth unused) still
runs while the programs that fit beside it stream their first tiles. The
skinny kernel cannot do this: its shared memory leaves no room beside
attention.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.layers.triton_norm_in_matmul import (
    add_residual_and_store_parts,
    check_residual,
    new_parts,
)
from runner.ops import pdl_launch
from runner.triton_dependent_launch import let_next_kernel_start, wait_for_previous_kernel

GEMV_BLOCK_N = 8  # outputs a program
GEMV_BLOCK_K = 2048  # weight columns a loop step loads (fewer where K is smaller)
GEMV_MAX_K = 2048  # the widest input ``uses_gemv`` sends here
GEMV_EARLY = True  # first weight tile loaded before the wait for the previous kernel
LM_HEAD_BLOCK_N = 4  # vocabulary rows a program of the LM head
LM_HEAD_BLOCK_K = 2048  # its weight columns a loop step (fewer where K is smaller)


@triton.jit
def _first_tile(w_rows, K, BLOCK_K: tl.constexpr, col_mask):
    """The first BLOCK_K-wide tile of the rows at ``w_rows`` (pointers to each
    row's first element), masked past K and past ``col_mask``."""
    ks = tl.arange(0, BLOCK_K)
    return tl.load(w_rows + ks[None, :], mask=col_mask[:, None] & (ks[None, :] < K), other=0.0)


@triton.jit
def _row_times_tiles(x_ptr, w_rows, w_first, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     col_mask):
    """sum_k x[k] * w[n, k] in float32 for the BLOCK_N rows at ``w_rows``,
    whose first tile ``w_first`` the caller loaded; each next tile's load is
    issued before the current tile is reduced."""
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    w_next = w_first
    for k0 in range(0, K, BLOCK_K):
        w = w_next
        ks_next = k0 + BLOCK_K + ks
        w_next = tl.load(w_rows + ks_next[None, :],
                         mask=col_mask[:, None] & (ks_next[None, :] < K), other=0.0)
        x = tl.load(x_ptr + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    return acc


@triton.jit
def _one_row_products(x_ptr, w_ptr, N, K, stride_w, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    """(x[0] . w[n] in float32, n, n < N) for this program's BLOCK_N outputs
    n, from the wait for the previous kernel to the signal that lets the next
    one start (after the loop has issued its loads). EARLY: the first weight
    tile is loaded before the wait."""
    wait_for_previous_kernel(PDL and not EARLY, LET_NEXT_START=False)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w_rows = w_ptr + cols[:, None].to(tl.int64) * stride_w
    w_first = _first_tile(w_rows, K, BLOCK_K, col_mask)
    wait_for_previous_kernel(PDL and EARLY, LET_NEXT_START=False)
    acc = _row_times_tiles(x_ptr, w_rows, w_first, K, BLOCK_N, BLOCK_K, col_mask)
    let_next_kernel_start(PDL)
    return acc, cols, col_mask


@triton.jit
def _gemv_add_kernel(x_ptr, w_ptr, residual_ptr, parts_ptr, N, K, stride_w,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EARLY: tl.constexpr,
                     PDL: tl.constexpr):
    """residual[0, n] += x[0] . w[n] for this program's BLOCK_N outputs, then
    parts[0, program] = the new values' sum of squares."""
    acc, cols, col_mask = _one_row_products(x_ptr, w_ptr, N, K, stride_w, BLOCK_N, BLOCK_K,
                                            EARLY, PDL)
    row = tl.arange(0, 1)
    add_residual_and_store_parts(acc[None, :], residual_ptr, 0, parts_ptr, row, row < 1, cols,
                                 col_mask, ROW_AXIS=0)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_w, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    """out[0, n] = x[0] . w[n], rounded once to out's dtype, for this
    program's BLOCK_N outputs."""
    acc, cols, col_mask = _one_row_products(x_ptr, w_ptr, N, K, stride_w, BLOCK_N, BLOCK_K,
                                            EARLY, PDL)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=col_mask)


def uses_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``row_parallel_matmul_add``, where the skinny kernel would take
    ``x @ weight.T``, takes ``gemv_matmul_add`` instead: one row, an input at
    most GEMV_MAX_K wide."""
    return x.shape[0] == 1 and weight.shape[1] <= GEMV_MAX_K


def _check_one_row(name: str, x: torch.Tensor, w: torch.Tensor) -> tuple[int, int]:
    """(N, K) of w [N, K]; ValueError unless x is one row of width K and both
    have unit last strides."""
    n, k = w.shape
    if x.shape != (1, k):
        raise ValueError(f"{name} takes one row of width {k}, got {tuple(x.shape)}")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError(f"{name} needs unit last strides")
    return n, k


def gemv_matmul_add(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``row_parallel_matmul_add_ref`` for one row: residual [1, N] += x [1, K]
    @ w [N, K].T in place, rounded as the unfused pair rounds; returns the
    new row's parts, float32 [1, cdiv(N, GEMV_BLOCK_N)]. Unit last strides."""
    n, k = _check_one_row("gemv_matmul_add", x, w)
    check_residual("gemv_matmul_add", x, n, residual)
    groups = triton.cdiv(n, GEMV_BLOCK_N)
    parts = new_parts(1, groups, x.device)
    _gemv_add_kernel[(groups,)](x, w, residual, parts, n, k, w.stride(0),
                                BLOCK_N=GEMV_BLOCK_N,
                                BLOCK_K=min(GEMV_BLOCK_K, triton.next_power_of_2(k)),
                                EARLY=GEMV_EARLY, num_warps=4, **pdl_launch(x.device))
    return parts


def gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [1, K] @ w [N, K].T -> [1, N] in w's dtype, each output a float32
    sum rounded once. Unit last strides."""
    n, k = _check_one_row("gemv", x, w)
    out = torch.empty(1, n, dtype=w.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, LM_HEAD_BLOCK_N),)](
        x, w, out, n, k, w.stride(0), BLOCK_N=LM_HEAD_BLOCK_N,
        BLOCK_K=min(LM_HEAD_BLOCK_K, triton.next_power_of_2(k)), EARLY=GEMV_EARLY, num_warps=4,
        **pdl_launch(x.device))
    return out
