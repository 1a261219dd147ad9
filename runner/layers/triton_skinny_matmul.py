"""Triton matmul for a few rows (decode batches): out = x @ w.T in one pass over w.

At batch 1-16 a projection is a matrix-vector product bound by reading the
weight once. For the row-parallel projections (o_proj, down) cuBLAS splits K
and launches a second kernel to reduce the splits; this kernel gives each
program BLOCK_N output columns and the whole of K, so there is one launch and
no partial sums in memory. Where those programs are too few for the SMs
(the 1B shape's 2048 outputs: 64), each column group is read by several
programs over ranges of K, and the last of them sums their parts in the same
launch (``split_k.py``). Rows are padded to one ROW_TILE of 16, the
smallest ``tl.dot`` takes, and every kernel here takes at most that many
(SKINNY_MAX_ROWS); batches of 17..64 rows go to the medium kernels
(``triton_medium_matmul.py``, weight as the dot's large operand) and
larger ones to cuBLAS. One row whose product adds into the residual and
whose input is narrow (the 1B shape's o projection) goes to the kernel
without ``tl.dot`` of ``triton_gemv.py`` instead (``uses_gemv``).

``RowParallelLinear`` uses it on CUDA (``runner.ops`` picks
``row_parallel_matmul`` there) for half-precision inputs of at most
SKINNY_MAX_ROWS rows and outputs wide enough to busy the SMs
(``uses_skinny_matmul``); ``bench_decode.py --cublas-only`` gives its layers
``F.linear`` instead, to compare (benchmarks/results/README.md keeps the
A/B). The qkv projection has its own variant with rotary in the epilogue
(``triton_qkv_rotary.py``). The input is loaded as it is: a dot operand computed while loading
(such as silu(gate) * up) stalls the pipelined weight loads.

``gate_up_silu`` is the same pass for the MLP's fused gate/up projection
with the activation in its epilogue: each program loads BLOCK_N gate rows
and the BLOCK_N up rows of the same outputs, and writes silu(gate) * up, so
the [M, 2I] projection never reaches memory and the activation needs no
launch of its own.

Both carry the decoder's norms where asked (``norm_in_matmul.py``,
``triton_norm_in_matmul.py``): ``skinny_matmul_add`` adds its product into
the residual in place and returns the new residual's parts (the producer,
ADD_RESIDUAL); ``skinny_gate_up_silu`` given parts reads the raw residual
and scales its sums by each row's rstd (the consumer, NORM).
``row_parallel_matmul_add`` and ``gate_up_silu`` route them as
``row_parallel_matmul`` routes the plain product.

Both kernels launch with programmatic dependent launch where the device has
it (``runner/triton_dependent_launch.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from runner.layers.dot_inputs import dot_inputs
from runner.layers.norm_in_matmul import normed_linear_ref, row_parallel_matmul_add_ref
from runner.layers.split_k import (
    choose_split_k,
    split_k_bounds,
    split_k_buffers,
    split_k_range,
    sum_split_parts,
)
from runner.layers.triton_gemv import gemv, gemv_matmul_add, uses_gemv
from runner.layers.triton_medium_matmul import (
    MEDIUM_MAX_ROWS,
    medium_gate_up_silu,
    medium_matmul,
    medium_matmul_add,
    medium_or_cublas,
    uses_medium_matmul,
)
from runner.layers.triton_norm_in_matmul import (
    add_residual_and_store_parts,
    check_residual,
    new_parts,
    norm_args,
    rstd_of_rows,
)
from runner.layers.triton_silu_mul import silu_mul_rounded, silu_mul_triton
from runner.ops import num_sms, pdl_launch
from runner.ticket_counters import take_ticket
from runner.triton_dependent_launch import let_next_kernel_start, wait_for_previous_kernel

ROW_TILE = 16  # the row tile of every skinny kernel: tl.dot's smallest M
SKINNY_MAX_ROWS = ROW_TILE
BLOCK_N = 32
BLOCK_K = 512
GATE_UP_BLOCK_N = 32  # outputs a program; it reads twice as many weight rows


@triton.jit
def _skinny_matmul_kernel(x_ptr, w_ptr, out_ptr, workspace_ptr, counters_ptr, parts_ptr, M, N,
                          K, K_PER_SPLIT, stride_x, stride_w, stride_out,
                          DOT_PRECISION: tl.constexpr, M_PAD: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                          ADD_RESIDUAL: tl.constexpr, PDL: tl.constexpr):
    """out[m, n] = sum_k x[m, k] w[n, k] for BLOCK_N columns and every row;
    program (j, s) reads K columns s * K_PER_SPLIT on (split_k.py).
    ADD_RESIDUAL: out is the residual, out[m, n] += that sum, and
    ``parts_ptr`` [M, column groups] gets the new rows' sums of squares
    (``add_residual_and_store_parts``); parts_ptr is None otherwise."""
    wait_for_previous_kernel(PDL, LET_NEXT_START=not ADD_RESIDUAL)
    group = tl.program_id(0)
    cols = group * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, M_PAD)
    row_mask = rows < M
    col_mask = cols < N
    k_lo, k_hi = split_k_bounds(K, K_PER_SPLIT, SPLIT_K)
    acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :],
                    mask=row_mask[:, None] & (ks[None, :] < k_hi), other=0.0)
        w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + ks[None, :],
                    mask=col_mask[:, None] & (ks[None, :] < k_hi), other=0.0)
        acc += tl.dot(a, tl.trans(w), input_precision=DOT_PRECISION)
    if ADD_RESIDUAL and SPLIT_K == 1:
        let_next_kernel_start(PDL)
    if SPLIT_K > 1:
        PART: tl.constexpr = M_PAD * BLOCK_N
        offs = rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        parts = workspace_ptr + group.to(tl.int64) * (SPLIT_K * PART)
        tl.store(parts + tl.program_id(1) * PART + offs, acc)
        if not take_ticket(counters_ptr + group, SPLIT_K):
            return
        acc = sum_split_parts(parts, offs, PART, SPLIT_K)
    if ADD_RESIDUAL:
        add_residual_and_store_parts(acc, out_ptr, stride_out, parts_ptr, rows, row_mask, cols,
                                     col_mask, ROW_AXIS=0)
    else:
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _skinny_gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, parts_ptr, M, N, K, stride_x, stride_w,
                                stride_out, num_parts, eps, DOT_PRECISION: tl.constexpr,
                                M_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr, P_PAD: tl.constexpr, PDL: tl.constexpr):
    """out[m, n] = silu(x[m] . w[n]) * (x[m] . w[N + n]) for BLOCK_N outputs
    n < N and every row; both products are rounded to the output dtype
    first, then the activation is the unfused kernel's arithmetic.
    P_PAD > 0 (NORM): both products of row m are first scaled by its rstd
    from ``parts_ptr`` [M, num_parts] (``rstd_of_rows``); P_PAD = 0 leaves
    parts_ptr, num_parts and eps None."""
    NORM: tl.constexpr = P_PAD > 0
    wait_for_previous_kernel(PDL, LET_NEXT_START=not NORM)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, M_PAD)
    row_mask = rows < M
    col_mask = cols < N
    gate_rows = cols[:, None].to(tl.int64) * stride_w
    up_rows = (cols[:, None] + N).to(tl.int64) * stride_w
    acc_gate = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks[None, :] < K
        a = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :],
                    mask=row_mask[:, None] & k_mask, other=0.0)
        w_gate = tl.load(w_ptr + gate_rows + ks[None, :], mask=col_mask[:, None] & k_mask,
                         other=0.0)
        w_up = tl.load(w_ptr + up_rows + ks[None, :], mask=col_mask[:, None] & k_mask,
                       other=0.0)
        acc_gate += tl.dot(a, tl.trans(w_gate), input_precision=DOT_PRECISION)
        acc_up += tl.dot(a, tl.trans(w_up), input_precision=DOT_PRECISION)
    if NORM:
        let_next_kernel_start(PDL)
        rstd = rstd_of_rows(parts_ptr, rows, row_mask, num_parts, K, eps, P_PAD)[:, None]
        acc_gate *= rstd
        acc_up *= rstd
    dtype = out_ptr.dtype.element_ty
    out = silu_mul_rounded(acc_gate.to(dtype).to(tl.float32), acc_up.to(dtype).to(tl.float32),
                           dtype)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out,
             mask=row_mask[:, None] & col_mask[None, :])


def check_rows(kernel: str, m: int) -> None:
    """The one row limit of every skinny kernel: the rows fit one ROW_TILE."""
    if m > SKINNY_MAX_ROWS:
        raise ValueError(f"{kernel} takes at most {SKINNY_MAX_ROWS} rows, got {m}")


def skinny_matmul(x: torch.Tensor, w: torch.Tensor, block_n: int = BLOCK_N,
                  block_k: int = BLOCK_K, num_warps: int = 4, num_stages: int = 4,
                  split_k: int | None = None) -> torch.Tensor:
    """x [M, K] @ w[N, K].T for M <= SKINNY_MAX_ROWS rows. Unit last strides.
    ``split_k``: programs per column group (None: ``choose_split_k``)."""
    _check_matmul("skinny_matmul", x, w)
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    _launch_matmul(x, w, out, None, block_n, block_k, num_warps, num_stages, split_k)
    return out


def skinny_matmul_add(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor,
                      block_n: int = BLOCK_N, block_k: int = BLOCK_K, num_warps: int = 4,
                      num_stages: int = 4, split_k: int | None = None) -> torch.Tensor:
    """``row_parallel_matmul_add_ref`` in one launch: residual [M, N] += x [M, K]
    @ w [N, K].T in place, rounded as the unfused pair rounds; returns the
    new residual's parts, float32 [M, cdiv(N, block_n)] (part j of a row:
    its squares summed over columns j * block_n on). Arguments as
    ``skinny_matmul``'s."""
    _check_matmul("skinny_matmul_add", x, w)
    check_residual("skinny_matmul_add", x, w.shape[0], residual)
    parts = new_parts(x.shape[0], triton.cdiv(w.shape[0], block_n), x.device)
    _launch_matmul(x, w, residual, parts, block_n, block_k, num_warps, num_stages, split_k)
    return parts


def _check_matmul(kernel: str, x: torch.Tensor, w: torch.Tensor) -> None:
    """One-line ValueErrors for a product the matmul kernel cannot take."""
    check_rows(kernel, x.shape[0])
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"input width {x.shape[1]} does not fit weight {tuple(w.shape)}")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError(f"{kernel} needs unit last strides")


def _launch_matmul(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                   parts: torch.Tensor | None, block_n: int, block_k: int, num_warps: int,
                   num_stages: int, split_k: int | None) -> None:
    """out = x @ w.T; with ``parts`` (ADD_RESIDUAL) out += x @ w.T and the
    parts of the new out."""
    m = x.shape[0]
    n, k = w.shape
    if m == 0:
        return
    programs = triton.cdiv(n, block_n)
    if split_k is None:
        split_k = choose_split_k(programs, k, block_k, num_sms(x.device))
    workspace, counters = split_k_buffers(split_k, programs, ROW_TILE * block_n, x.device)
    _skinny_matmul_kernel[(programs, split_k)](
        x, w, out, workspace, counters, parts, m, n, k, split_k_range(k, block_k, split_k),
        x.stride(0), w.stride(0), out.stride(0),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", M_PAD=ROW_TILE,
        BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, ADD_RESIDUAL=parts is not None,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(x.device))


def skinny_inputs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """What every skinny kernel needs of ``x @ weight.T``: half precision, at
    most SKINNY_MAX_ROWS rows, unit last strides."""
    return dot_inputs(x, weight, 1, SKINNY_MAX_ROWS)


def uses_skinny_matmul(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` (a row-parallel projection) takes the skinny
    kernel (asked on CUDA only): half precision, at most SKINNY_MAX_ROWS rows, unit last
    strides, and enough programs (BLOCK_N-wide column groups, split over K
    where they are few) for about every SM: fewer leave SMs idle, and
    cuBLAS's split-K serves them better."""
    if not skinny_inputs(x, weight):
        return False
    programs = triton.cdiv(weight.shape[0], BLOCK_N)
    return programs * skinny_split_k(x, weight) >= 3 * num_sms(x.device) // 4


def skinny_split_k(x: torch.Tensor, weight: torch.Tensor) -> int:
    """The split of K that ``skinny_matmul`` chooses for ``x @ weight.T``."""
    programs = triton.cdiv(weight.shape[0], BLOCK_N)
    return choose_split_k(programs, weight.shape[1], BLOCK_K, num_sms(x.device))


def row_parallel_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` on CUDA: the skinny kernel where ``uses_skinny_matmul``
    says it wins, the medium kernel for 17..64 rows (``medium_or_cublas``),
    cuBLAS (``F.linear``) elsewhere."""
    if uses_skinny_matmul(x, weight):
        return skinny_matmul(x, weight)
    return medium_or_cublas(x, weight)


# The LM head through the Triton kernels (False: cuBLAS at every row count, for A/B runs).
LM_HEAD_TRITON = True
# The fewest rows whose LM head takes the medium kernel (up to MEDIUM_MAX_ROWS):
# at the vocabulary table's shape it beats cuBLAS from 2 rows on, although the
# decoder's own projections below 17 rows take the skinny kernels.
LM_HEAD_MEDIUM_MIN_ROWS = 2


def lm_head_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` on CUDA for the LM head (``vocab_parallel.py``):
    one half precision row through the register-streaming ``gemv``;
    LM_HEAD_MEDIUM_MIN_ROWS..MEDIUM_MAX_ROWS rows through the medium kernel
    at its default config (the vocabulary table's shape is in no tuned
    table: that tile reads it faster than cuBLAS, and no memset launch
    comes before it); cuBLAS for more rows, whose tiles reuse the table."""
    if not LM_HEAD_TRITON:
        return F.linear(x, weight)
    if dot_inputs(x, weight, 1, 1):
        return gemv(x, weight)
    if dot_inputs(x, weight, LM_HEAD_MEDIUM_MIN_ROWS, MEDIUM_MAX_ROWS):
        return medium_matmul(x, weight)
    return F.linear(x, weight)


def row_parallel_matmul_add(x: torch.Tensor, weight: torch.Tensor,
                            residual: torch.Tensor) -> torch.Tensor:
    """``row_parallel_matmul_add_ref`` on CUDA, routed as
    ``row_parallel_matmul``: the skinny kernel (for one row of a narrow
    input the one-row kernel instead, ``triton_gemv.uses_gemv``), the medium
    one, elsewhere the reference (cuBLAS's product, then torch's add and
    squares)."""
    if uses_skinny_matmul(x, weight):
        if uses_gemv(x, weight):
            return gemv_matmul_add(x, weight, residual)
        return skinny_matmul_add(x, weight, residual)
    if uses_medium_matmul(x, weight):
        return medium_matmul_add(x, weight, residual)
    return row_parallel_matmul_add_ref(x, weight, residual)


def skinny_gate_up_silu(x: torch.Tensor, w: torch.Tensor, block_n: int = GATE_UP_BLOCK_N,
                        block_k: int = 128, num_warps: int = 4, num_stages: int = 3,
                        parts: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """x [M, K] and w [2I, K] (gate rows, then up rows) -> silu(x @ gate.T) *
    (x @ up.T), [M, I], for M <= SKINNY_MAX_ROWS rows. Unit last strides.
    With ``parts`` (float32 [M, P], a producer's) x is the raw residual:
    ``gate_up_silu_ref(x, w, parts, eps)``."""
    m = x.shape[0]
    two_n, k = w.shape
    check_rows("skinny_gate_up_silu", m)
    if x.shape[1] != k or two_n % 2:
        raise ValueError(f"input width {x.shape[1]} does not fit weight {tuple(w.shape)}")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("skinny_gate_up_silu needs unit last strides")
    norm = norm_args("skinny_gate_up_silu", parts, eps, m)
    n = two_n // 2
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    _skinny_gate_up_silu_kernel[(triton.cdiv(n, block_n),)](
        x_ptr=x, w_ptr=w, out_ptr=out, M=m, N=n, K=k, stride_x=x.stride(0),
        stride_w=w.stride(0), stride_out=out.stride(0), **norm,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", M_PAD=ROW_TILE,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
        **pdl_launch(x.device))
    return out


def uses_skinny_gate_up_silu(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``gate_up_silu`` takes the skinny kernel: the same limits as
    ``uses_skinny_matmul``, counted in outputs (GATE_UP_BLOCK_N a program)."""
    return (skinny_inputs(x, weight)
            and triton.cdiv(weight.shape[0] // 2, GATE_UP_BLOCK_N) >= 3 * num_sms(x.device) // 4)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, parts: torch.Tensor | None = None,
                 eps: float = 0.0) -> torch.Tensor:
    """silu(gate) * up of the MLP's fused projection on CUDA
    (``gate_up_silu_ref``, with ``parts`` of the raw residual x): one skinny
    launch for decode batches (``uses_skinny_gate_up_silu``), one medium
    launch for 17..64 rows (``uses_medium_matmul``), the projection then the
    activation kernel elsewhere (``cublas_gate_up_silu``)."""
    if uses_skinny_gate_up_silu(x, weight):
        return skinny_gate_up_silu(x, weight, parts=parts, eps=eps)
    if uses_medium_matmul(x, weight, "gate_up"):
        return medium_gate_up_silu(x, weight, parts=parts, eps=eps)
    return cublas_gate_up_silu(x, weight, parts, eps)


def cublas_gate_up_silu(x: torch.Tensor, weight: torch.Tensor, parts: torch.Tensor | None = None,
                        eps: float = 0.0) -> torch.Tensor:
    """The unfused pair on CUDA: cuBLAS's projection, then the activation
    kernel (``bench_decode.py --cublas-only`` takes it at every size). With
    ``parts`` the projection is ``normed_linear_ref``'s: float32 sums scaled
    by rstd and rounded once, which no rounded product can be scaled into."""
    if parts is None:
        return silu_mul_triton(F.linear(x, weight))
    return silu_mul_triton(normed_linear_ref(x, weight, parts, eps))
