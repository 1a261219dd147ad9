"""The Triton side of the decoder norms carried by the matmuls (``norm_in_matmul.py``).

The decode-size matmul kernels (``triton_skinny_matmul.py``,
``triton_medium_matmul.py``, ``triton_qkv_rotary.py``) have two epilogue
modes, each a constexpr that is off by default, so a plain launch compiles
to the code it had without them:

- ADD_RESIDUAL, the producer (o_proj, down): the output pointer is the
  residual. The epilogue adds the product into it in place and stores the
  ``parts`` [M, P] of the new residual (``add_residual_and_store_parts``),
  P the launch's column groups (programs along axis 0), part j of a row the
  sum of its squares over group j's columns.
- NORM, the consumer (gate/up + SiLU, qkv + rotary), on while P_PAD, the
  next power of two of the parts' width, is not 0: x is the raw residual,
  and the epilogue multiplies each row's float32 sums by its rstd
  (``rstd_of_rows``) before anything else it does.

Both run where the epilogue runs: with split-K, only in a column group's
last program, after it has summed the splits' parts (``split_k.py``). The
arithmetic is the references' (``row_parallel_matmul_add_ref``,
``normed_linear_ref``): the product rounded to the dtype, then its sum with
the residual, and the parts of that rounded sum; the consumer's sums scaled
in float32 and rounded once, by the epilogue that follows.

A kernel in either mode lets the next kernel start after its K loop rather
than at its top, or at its exit where it splits K
(``runner/triton_dependent_launch.py`` says why).

The skinny kernels hold their sums as [rows, columns], the medium one as
[columns, rows]; ROW_AXIS names the rows' axis, as in
``qkv_rotary_epilogue.py``. ``norms_in_matmuls`` is the runner's question
on CUDA: whether every projection of a batch size takes one of these
kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The consumer kernels' norm arguments when the mode is off.
NO_NORM = dict(parts_ptr=None, num_parts=None, eps=None, P_PAD=0)


@triton.jit
def add_residual_and_store_parts(acc, residual_ptr, stride_residual, parts_ptr, rows, row_mask,
                                 cols, col_mask, ROW_AXIS: tl.constexpr):
    """residual[m, n] <- dtype(float(dtype(acc)) + float(residual[m, n])) for
    the real ``rows`` and ``cols`` (1-D) of ``acc`` (float32, rows along
    ROW_AXIS); then parts[m, j] <- the sum over those columns of the new
    value's square, in float32, j this program's column group (parts [M, P]
    contiguous, P = num_programs(0)). Masked columns add nothing."""
    dtype = residual_ptr.dtype.element_ty
    at_rows = tl.expand_dims(rows, 1 - ROW_AXIS)
    at_cols = tl.expand_dims(cols, ROW_AXIS)
    mask = tl.expand_dims(row_mask, 1 - ROW_AXIS) & tl.expand_dims(col_mask, ROW_AXIS)
    ptrs = residual_ptr + at_rows * stride_residual + at_cols
    residual = tl.load(ptrs, mask=mask, other=0.0)
    total = (acc.to(dtype).to(tl.float32) + residual.to(tl.float32)).to(dtype)
    tl.store(ptrs, total, mask=mask)
    value = tl.where(mask, total.to(tl.float32), 0.0)
    squares = tl.sum(value * value, axis=1 - ROW_AXIS)
    tl.store(parts_ptr + rows * tl.num_programs(0) + tl.program_id(0), squares, mask=row_mask)


@triton.jit
def rstd_of_rows(parts_ptr, rows, row_mask, num_parts, K, eps, P_PAD: tl.constexpr):
    """rsqrt(sum_p parts[m, p] / K + eps) for each of ``rows`` (1-D), float32;
    parts [M, num_parts] contiguous, num_parts <= P_PAD. Rows past
    ``row_mask`` get rsqrt(eps): their outputs are never stored."""
    p = tl.arange(0, P_PAD)
    parts = tl.load(parts_ptr + rows[:, None] * num_parts + p[None, :],
                    mask=row_mask[:, None] & (p < num_parts)[None, :], other=0.0)
    return tl.rsqrt(tl.sum(parts, axis=1) / K + eps)


def check_residual(kernel: str, x: torch.Tensor, n: int, residual: torch.Tensor) -> None:
    """One-line ValueErrors for a residual that a producer ``kernel`` of
    ``n`` outputs cannot add into: it must be [rows of x, n] in x's dtype,
    with unit last stride."""
    if residual.shape != (x.shape[0], n) or residual.dtype != x.dtype:
        raise ValueError(f"{kernel}: residual {tuple(residual.shape)} {residual.dtype} does not "
                         f"fit the output [{x.shape[0]}, {n}] {x.dtype}")
    if residual.stride(-1) != 1:
        raise ValueError(f"{kernel} needs the residual's unit last stride")


def new_parts(rows: int, groups: int, device: torch.device) -> torch.Tensor:
    """The float32 parts [rows, groups] a producer launch of ``groups`` column
    groups writes (every entry of every row)."""
    return torch.empty(rows, groups, dtype=torch.float32, device=device)


def norm_args(kernel: str, parts: torch.Tensor | None, eps: float, rows: int) -> dict:
    """A consumer ``kernel``'s norm arguments: NO_NORM without ``parts``,
    else the parts (float32 [rows, P], P >= 1, contiguous), P, eps and P's
    next power of two as P_PAD."""
    if parts is None:
        return NO_NORM
    if (parts.dtype != torch.float32 or parts.dim() != 2 or parts.shape[0] != rows
            or parts.shape[1] < 1 or not parts.is_contiguous()):
        raise ValueError(f"{kernel} takes parts as contiguous float32 [{rows}, P >= 1], got "
                         f"{tuple(parts.shape)} {parts.dtype}")
    return dict(parts_ptr=parts, num_parts=parts.shape[1], eps=eps,
                P_PAD=triton.next_power_of_2(parts.shape[1]))


def norms_in_matmuls(rows: int, dtype: torch.dtype, device: torch.device,
                     qkv_weight: torch.Tensor, o_weight: torch.Tensor,
                     gate_up_weight: torch.Tensor, down_weight: torch.Tensor,
                     head_dim: int) -> bool:
    """``norms_in_matmuls_ref`` on CUDA: whether a forward of ``rows`` tokens
    carries its norms in the matmuls, that is whether each of its four
    projections takes a skinny or medium kernel with the modes (elsewhere
    the references would run them, the consumers' in float32)."""
    # The kernels' modules import this one's helpers: their routing is imported here.
    from runner.layers.triton_medium_matmul import (
        MEDIUM_MAX_ROWS,
        uses_medium_matmul,
        uses_medium_qkv_rotary,
    )
    from runner.layers.triton_qkv_rotary import uses_skinny_qkv_rotary
    from runner.layers.triton_skinny_matmul import (
        uses_skinny_gate_up_silu,
        uses_skinny_matmul,
    )

    if rows > MEDIUM_MAX_ROWS:  # cuBLAS takes every projection (and a prefill asks here)
        return False

    def inputs(weight: torch.Tensor) -> torch.Tensor:  # the shape the routing asks about
        return torch.empty(1, weight.shape[1], dtype=dtype, device=device).expand(rows, -1)

    def producer(weight: torch.Tensor) -> bool:
        x = inputs(weight)
        return uses_skinny_matmul(x, weight) or uses_medium_matmul(x, weight)

    qkv_x, gate_up_x = inputs(qkv_weight), inputs(gate_up_weight)
    return ((uses_skinny_qkv_rotary(qkv_x, qkv_weight, head_dim)
             or uses_medium_qkv_rotary(qkv_x, qkv_weight, head_dim))
            and (uses_skinny_gate_up_silu(gate_up_x, gate_up_weight)
                 or uses_medium_matmul(gate_up_x, gate_up_weight, "gate_up"))
            and producer(o_weight) and producer(down_weight))
