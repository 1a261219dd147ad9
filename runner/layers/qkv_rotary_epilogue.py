"""The epilogue of the one-launch qkv projections: rotate, then store q and the KV cache.

The fused qkv launches (the skinny one of ``triton_qkv_rotary.py`` for 1..16
rows, the medium one of ``triton_medium_matmul.py`` for 17..64) give a
program BLOCK_P rotary pairs (p, p + HEAD_DIM / 2) of one head for every
row: it ends with the float32 sums of the pairs' first ("lo") and second
("hi") weight rows. ``rotate_and_store_pairs`` does the rest for both:

- each sum is rounded to the output dtype first, as the unfused pair's
  projection output is, then rotated in float32 and rounded again, as
  ``rotary_write_kv_triton`` does (q and k heads; v heads are not rotated);
- a q head's pairs go to the q output [M, Hq, D]; a k or v head's pairs to
  the row's paged-cache slot (``slot_mapping``), where rows with slot -1,
  or past the end of ``slot_mapping`` (padded rows of a graph batch), store
  nothing.

The two kernels hold their sums in opposite orientations: the skinny one
[rows, pairs] (x is its dot's A operand), the medium one [pairs, rows]
(the weight is). ROW_AXIS names the rows' axis; the per-row loads
(position, slot) are 1-D either way and are broadcast over the pairs.
``check_qkv_rotary`` holds the launchers' common checks of their inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def check_qkv_rotary(kernel: str, x: torch.Tensor, weight: torch.Tensor, kv_cache: torch.Tensor,
                     num_q_heads: int, num_kv_heads: int, block_p: int) -> None:
    """One-line ValueErrors for inputs a fused qkv launch named ``kernel``
    cannot take (each launcher checks its own row limit): the weight's rows
    must be the heads', its columns x's; ``block_p`` pairs must tile half
    a head; the last strides must be 1."""
    k, head_dim = x.shape[-1], kv_cache.shape[-1]
    if weight.shape != ((num_q_heads + 2 * num_kv_heads) * head_dim, k):
        raise ValueError(f"qkv weight {tuple(weight.shape)} does not fit {num_q_heads} q and "
                         f"{num_kv_heads} kv heads of {head_dim} over input width {k}")
    if head_dim % (2 * block_p):
        raise ValueError(f"head_dim {head_dim} is not a multiple of 2 * block_p ({block_p})")
    if x.stride(-1) != 1 or weight.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError(f"{kernel} needs unit last strides")


@triton.jit
def rotate_and_store_pairs(
    acc_lo, acc_hi, head, pairs, rows, row_mask, positions_ptr, cos_ptr, sin_ptr, q_out_ptr,
    stride_q_tok, key_cache_ptr, value_cache_ptr, slot_mapping_ptr, num_slots, stride_c_block,
    stride_c_slot, stride_c_head, num_q_heads, num_kv_heads, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, ROW_AXIS: tl.constexpr,
):
    """acc_lo, acc_hi: float32 sums of ``head``'s pairs ``pairs`` (1-D) for
    ``rows`` (1-D, ``row_mask`` the real ones), rows along ROW_AXIS. Heads
    below num_q_heads are q, then num_kv_heads k heads, then v heads."""
    HALF: tl.constexpr = HEAD_DIM // 2
    dtype = q_out_ptr.dtype.element_ty
    x1 = acc_lo.to(dtype).to(tl.float32)
    x2 = acc_hi.to(dtype).to(tl.float32)
    at_rows = tl.expand_dims(rows, 1 - ROW_AXIS)
    at_pairs = tl.expand_dims(pairs, ROW_AXIS)
    out_mask = tl.expand_dims(row_mask, 1 - ROW_AXIS) & (at_pairs < HALF)
    if head < num_q_heads + num_kv_heads:  # q or k: rotate
        pos = tl.load(positions_ptr + rows, mask=row_mask, other=0).to(tl.int64)
        angle = tl.expand_dims(pos, 1 - ROW_AXIS) * HALF + at_pairs
        cos = tl.load(cos_ptr + angle, mask=out_mask, other=0.0)
        sin = tl.load(sin_ptr + angle, mask=out_mask, other=0.0)
        x1, x2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if head < num_q_heads:
        dst = q_out_ptr + at_rows.to(tl.int64) * stride_q_tok + head * HEAD_DIM
        tl.store(dst + at_pairs, x1.to(dtype), mask=out_mask)
        tl.store(dst + HALF + at_pairs, x2.to(dtype), mask=out_mask)
    else:
        slot = tl.load(slot_mapping_ptr + rows, mask=row_mask & (rows < num_slots), other=-1)
        slot = slot.to(tl.int64)
        cache_mask = out_mask & tl.expand_dims(slot >= 0, 1 - ROW_AXIS)
        slot = tl.maximum(slot, 0)
        cache_off = (slot // BLOCK_SIZE) * stride_c_block + (slot % BLOCK_SIZE) * stride_c_slot
        cache_off = tl.expand_dims(cache_off, 1 - ROW_AXIS)
        if head < num_q_heads + num_kv_heads:
            dst = key_cache_ptr + cache_off + (head - num_q_heads) * stride_c_head
        else:
            dst = value_cache_ptr + cache_off + (head - num_q_heads - num_kv_heads) * stride_c_head
        cache_dtype = key_cache_ptr.dtype.element_ty
        tl.store(dst + at_pairs, x1.to(cache_dtype), mask=cache_mask)
        tl.store(dst + HALF + at_pairs, x2.to(cache_dtype), mask=cache_mask)
