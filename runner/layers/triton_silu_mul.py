"""Triton SiLU-and-multiply for the gated MLP: out = silu(gate) * up.

Input [T, 2I] holds gate then up. Matches ``F.silu(gate) * up`` in the
input dtype: silu is computed in float32 and rounded before the product,
which is rounded again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, inter, x_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + inter + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, silu_mul_rounded(gate, up, out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def silu_mul_rounded(gate, up, dtype: tl.constexpr):
    """silu(gate) * up in ``dtype`` from float32 gate and up that hold values
    of ``dtype``: silu in float32 rounded to ``dtype``, then the product
    rounded again, as ``F.silu(gate) * up`` rounds. The fused projections
    (skinny, medium) round their float32 sums to ``dtype`` first and call
    this, so they match the unfused pair."""
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


def silu_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] (unit last stride) -> silu(x[:, :I]) * x[:, I:], [T, I]."""
    num_tokens, width = x.shape
    inter = width // 2
    if x.stride(-1) != 1 or width % 2:
        raise ValueError("silu_mul_triton needs an even, unit-stride last dimension")
    out = torch.empty(num_tokens, inter, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul_kernel[(num_tokens, triton.cdiv(inter, block))](
        x, out, inter, x.stride(0), out.stride(0), BLOCK=block, num_warps=4)
    return out
