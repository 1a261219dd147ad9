"""Triton kernel that writes one step's keys and values into the paged KV cache.

Cache layout: kv_cache[2, num_blocks, block_size, num_kv_heads, head_dim], where
index 0 holds keys and 1 values. Token t goes to slot s = slot_mapping[t], that is
block s // block_size, offset s % block_size. Tokens with slot -1 (padding) are
skipped and leave the cache untouched. The grid is one program per token of the
padded batch, so the launch depends only on host shapes (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    num_kv_heads,
    head_dim,
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, DIM_PAD)
    mask = (heads[:, None] < num_kv_heads) & (dims[None, :] < head_dim)

    k_src = k_ptr + tok * stride_k_tok + heads[:, None] * stride_k_head + dims[None, :]
    v_src = v_ptr + tok * stride_v_tok + heads[:, None] * stride_v_head + dims[None, :]
    dst = block * stride_c_block + offset * stride_c_slot
    dst = dst + heads[:, None] * stride_c_head + dims[None, :]

    key = tl.load(k_src, mask=mask)
    value = tl.load(v_src, mask=mask)
    tl.store(key_cache_ptr + dst, key.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + dst, value.to(value_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store k[t], v[t] ([T, Hkv, D]) at cache slot slot_mapping[t] for every t != -1.

    Only the first min(T, len(slot_mapping)) tokens are considered. The last dim of
    k, v and kv_cache must be contiguous (stride 1); other strides are free.
    """
    num_tokens = min(k.shape[0], slot_mapping.shape[0])
    if num_tokens == 0:
        return
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    _kv_write_kernel[(num_tokens,)](
        k,
        v,
        key_cache,
        value_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        num_kv_heads,
        head_dim,
        BLOCK_SIZE=key_cache.shape[1],
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
    )
