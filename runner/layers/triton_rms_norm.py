"""Triton RMSNorm, optionally fused with the residual add before it.

Numerics follow the torch path in ``rms_norm.py`` (Hugging Face's Llama):
the residual sum is rounded to the input dtype (as a plain ``x + residual``
would be), the normalization runs in float32 and is rounded to the input
dtype before the weight multiplies it. Only the order of the float32 sum of
squares differs, so results agree to float32 rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.ops import pdl_launch
from runner.triton_dependent_launch import wait_for_previous_kernel


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr,
    n_cols, x_stride, residual_stride, out_stride, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_ptr + row * residual_stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / n_cols
    normed = (xf * tl.rsqrt(mean_sq + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * out_stride + cols, out, mask=mask)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    residual: torch.Tensor | None = None) -> torch.Tensor:
    """weight * norm(x) (or of ``x + residual``) over the last dimension.

    With ``residual``, the sum ``x + residual`` is written into ``residual``
    in place (the caller's next residual) and the normed sum is returned.
    ``x`` and ``residual`` need unit stride in their last dimension.
    """
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        raise ValueError("rms_norm_triton needs a unit last-dimension stride")
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    res2 = x2 if residual is None else residual.view(-1, n_cols)
    if x2.shape[0] == 0:
        return out.view(x.shape)
    block = triton.next_power_of_2(n_cols)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, res2, weight, out, n_cols, x2.stride(0), res2.stride(0), out.stride(0), eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)),
        **pdl_launch(x.device),
    )
    return out.view(x.shape)


def fused_add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual) with the sum written into ``residual``."""
    return rms_norm_triton(x, weight, eps, residual), residual
