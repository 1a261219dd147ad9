"""Triton rotary embedding: q and k of one token rotated in one program.

Same arithmetic as ``rotary._rotate`` (half-split layout, float32, rounded
to the input dtype): out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin.
q and k may be strided views (slices of the fused qkv output).

Two entry points: ``rotary_triton`` returns new contiguous q and k;
``rotary_write_kv_triton`` returns q and stores the rotated k, and v, straight
into the paged KV cache at the token's slot (slot -1: not stored), which
saves the attention backend's separate KV-write launch; asked to, it also
leaves the rotated k in place of k, for a backend that attends to a fresh
prompt's own keys (``runner.attention.fresh_prefill``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.ops import pdl_launch
from runner.triton_dependent_launch import wait_for_previous_kernel


@triton.jit
def _load_cos_sin(positions_ptr, cos_ptr, sin_ptr, token, HALF: tl.constexpr,
                  HALF_BLOCK: tl.constexpr):
    pos = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF_BLOCK)[None, :]
    cos = tl.load(cos_ptr + pos * HALF + dims, mask=dims < HALF, other=0.0)
    sin = tl.load(sin_ptr + pos * HALF + dims, mask=dims < HALF, other=0.0)
    return cos, sin


@triton.jit
def _rotate_heads(src, dst, src_head_stride, dst_head_stride, num_heads, cos, sin, store,
                  HALF: tl.constexpr, HALF_BLOCK: tl.constexpr, HEADS_BLOCK: tl.constexpr):
    """Rotate heads 0 .. num_heads - 1 at ``src`` (one token) into ``dst``."""
    heads = tl.arange(0, HEADS_BLOCK)[:, None]
    dims = tl.arange(0, HALF_BLOCK)[None, :]
    mask = (heads < num_heads) & (dims < HALF)
    x1 = tl.load(src + heads * src_head_stride + dims, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + heads * src_head_stride + HALF + dims, mask=mask, other=0.0)
    x2 = x2.to(tl.float32)
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    out = dst + heads * dst_head_stride + dims
    store_mask = tl.where(store, mask, False)  # (a scalar & block mask breaks the interpreter)
    tl.store(out, out1.to(dst.dtype.element_ty), mask=store_mask)
    tl.store(out + HALF, out2.to(dst.dtype.element_ty), mask=store_mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr,
    q_token_stride, q_head_stride, k_token_stride, k_head_stride, num_q_heads, num_k_heads,
    HALF: tl.constexpr, HALF_BLOCK: tl.constexpr, Q_HEADS_BLOCK: tl.constexpr,
    K_HEADS_BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _load_cos_sin(positions_ptr, cos_ptr, sin_ptr, token, HALF, HALF_BLOCK)
    _rotate_heads(q_ptr + token * q_token_stride, q_out_ptr + token * num_q_heads * 2 * HALF,
                  q_head_stride, 2 * HALF, num_q_heads, cos, sin, token >= 0,
                  HALF, HALF_BLOCK, Q_HEADS_BLOCK)
    _rotate_heads(k_ptr + token * k_token_stride, k_out_ptr + token * num_k_heads * 2 * HALF,
                  k_head_stride, 2 * HALF, num_k_heads, cos, sin, token >= 0,
                  HALF, HALF_BLOCK, K_HEADS_BLOCK)


@triton.jit
def _rotary_write_kv_kernel(
    positions_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, q_out_ptr,
    key_cache_ptr, value_cache_ptr, slot_mapping_ptr, num_slots,
    q_token_stride, q_head_stride, k_token_stride, k_head_stride, v_token_stride,
    v_head_stride, stride_c_block, stride_c_slot, stride_c_head, num_q_heads, num_k_heads,
    BLOCK_SIZE: tl.constexpr, HALF: tl.constexpr, HALF_BLOCK: tl.constexpr,
    Q_HEADS_BLOCK: tl.constexpr, K_HEADS_BLOCK: tl.constexpr, DIM_BLOCK: tl.constexpr,
    ROTATE_K_IN_PLACE: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _load_cos_sin(positions_ptr, cos_ptr, sin_ptr, token, HALF, HALF_BLOCK)
    _rotate_heads(q_ptr + token * q_token_stride, q_out_ptr + token * num_q_heads * 2 * HALF,
                  q_head_stride, 2 * HALF, num_q_heads, cos, sin, token >= 0,
                  HALF, HALF_BLOCK, Q_HEADS_BLOCK)
    slot = tl.load(slot_mapping_ptr + token, mask=token < num_slots, other=-1).to(tl.int64)
    store = slot >= 0
    slot = tl.maximum(slot, 0)
    cache_off = (slot // BLOCK_SIZE) * stride_c_block + (slot % BLOCK_SIZE) * stride_c_slot
    _rotate_heads(k_ptr + token * k_token_stride, key_cache_ptr + cache_off, k_head_stride,
                  stride_c_head, num_k_heads, cos, sin, store, HALF, HALF_BLOCK, K_HEADS_BLOCK)
    if ROTATE_K_IN_PLACE:  # after the cache's copy, which read k unrotated
        _rotate_heads(k_ptr + token * k_token_stride, k_ptr + token * k_token_stride,
                      k_head_stride, k_head_stride, num_k_heads, cos, sin, token >= 0,
                      HALF, HALF_BLOCK, K_HEADS_BLOCK)
    heads = tl.arange(0, K_HEADS_BLOCK)[:, None]
    dims = tl.arange(0, DIM_BLOCK)[None, :]
    mask = tl.where(store, (heads < num_k_heads) & (dims < 2 * HALF), False)
    value = tl.load(v_ptr + token * v_token_stride + heads * v_head_stride + dims, mask=mask)
    tl.store(value_cache_ptr + cache_off + heads * stride_c_head + dims,
             value.to(value_cache_ptr.dtype.element_ty), mask=mask)


def _check_heads(q: torch.Tensor, k: torch.Tensor) -> None:
    if q.stride(-1) != 1 or k.stride(-1) != 1 or q.shape[-1] % 2:
        raise ValueError("rotary kernels need an even head_dim of unit stride")


def _head_blocks(q: torch.Tensor, k: torch.Tensor) -> dict[str, int]:
    half = q.shape[-1] // 2
    return dict(HALF=half, HALF_BLOCK=triton.next_power_of_2(half),
                Q_HEADS_BLOCK=triton.next_power_of_2(q.shape[1]),
                K_HEADS_BLOCK=triton.next_power_of_2(k.shape[1]))


def rotary_triton(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T]; q [T, Hq, D], k [T, Hk, D] (unit stride in D);
    cos, sin [max_positions, D / 2] float32, contiguous -> rotated (q, k)."""
    _check_heads(q, k)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.shape[0] == 0:
        return q_out, k_out
    _rotary_kernel[(q.shape[0],)](
        positions, cos, sin, q, k, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), q.shape[1], k.shape[1],
        **_head_blocks(q, k), num_warps=4,
    )
    return q_out, k_out


def rotary_write_kv_triton(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           rotate_k_in_place: bool = False) -> torch.Tensor:
    """Rotate q (returned, contiguous) and k; store rotated k and v of token t
    at cache slot slot_mapping[t] (kv_cache [2, blocks, block_size, Hk, D]);
    tokens with slot -1, or past the end of slot_mapping, store nothing.
    ``rotate_k_in_place``: k itself is left rotated too."""
    _check_heads(q, k)
    if v.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("rotary_write_kv_triton needs unit-stride head dims")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0:
        return q_out
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    _rotary_write_kv_kernel[(q.shape[0],)](
        positions, cos, sin, q, k, v, q_out, key_cache, value_cache, slot_mapping,
        slot_mapping.shape[0], q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        q.shape[1], k.shape[1], BLOCK_SIZE=key_cache.shape[1],
        DIM_BLOCK=triton.next_power_of_2(q.shape[-1]), **_head_blocks(q, k), num_warps=4,
        ROTATE_K_IN_PLACE=rotate_k_in_place, **pdl_launch(q.device),
    )
    return q_out
