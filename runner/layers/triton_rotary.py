"""Triton rotary embedding: q and k of one token rotated in one program.

Same arithmetic as ``rotary._rotate`` (half-split layout, float32, rounded
to the input dtype): out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin.
q and k may be strided views (slices of the fused qkv output); the results
are new contiguous tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, token, src_token_stride, src_head_stride, num_heads,
                  cos, sin, HALF: tl.constexpr, HALF_BLOCK: tl.constexpr,
                  HEADS_BLOCK: tl.constexpr):
    heads = tl.arange(0, HEADS_BLOCK)[:, None]
    dims = tl.arange(0, HALF_BLOCK)[None, :]
    mask = (heads < num_heads) & (dims < HALF)
    src = src_ptr + token * src_token_stride + heads * src_head_stride + dims
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    dst = dst_ptr + token * num_heads * 2 * HALF + heads * 2 * HALF + dims
    tl.store(dst, out1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, out2.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr,
    q_token_stride, q_head_stride, k_token_stride, k_head_stride, num_q_heads, num_k_heads,
    HALF: tl.constexpr, HALF_BLOCK: tl.constexpr, Q_HEADS_BLOCK: tl.constexpr,
    K_HEADS_BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF_BLOCK)[None, :]
    cos = tl.load(cos_ptr + pos * HALF + dims, mask=dims < HALF, other=0.0)
    sin = tl.load(sin_ptr + pos * HALF + dims, mask=dims < HALF, other=0.0)
    _rotate_heads(q_ptr, q_out_ptr, token, q_token_stride, q_head_stride, num_q_heads,
                  cos, sin, HALF, HALF_BLOCK, Q_HEADS_BLOCK)
    _rotate_heads(k_ptr, k_out_ptr, token, k_token_stride, k_head_stride, num_k_heads,
                  cos, sin, HALF, HALF_BLOCK, K_HEADS_BLOCK)


def rotary_triton(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T]; q [T, Hq, D], k [T, Hk, D] (unit stride in D);
    cos, sin [max_positions, D / 2] float32, contiguous -> rotated (q, k)."""
    num_tokens, num_q_heads, head_dim = q.shape
    half = head_dim // 2
    if q.stride(-1) != 1 or k.stride(-1) != 1 or head_dim % 2:
        raise ValueError("rotary_triton needs an even head_dim of unit stride")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    _rotary_kernel[(num_tokens,)](
        positions, cos, sin, q, k, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), num_q_heads, k.shape[1],
        HALF=half, HALF_BLOCK=triton.next_power_of_2(half), Q_HEADS_BLOCK=triton.next_power_of_2(num_q_heads),
        K_HEADS_BLOCK=triton.next_power_of_2(k.shape[1]), num_warps=4,
    )
    return q_out, k_out
