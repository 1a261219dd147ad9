"""Combining split-KV (flash-decoding) partials inside the attention launch.

The math. For one (token, query head), split s left an unnormalised
accumulator acc_s, the running max m_s (base-2 logits) and the sum l_s of
exp2(logit - m_s). With M = max_s m_s and w_s = exp2(m_s - M), the attention
output is
    sum_s w_s * acc_s / sum_s w_s * l_s.
A split whose keys a row cannot see (causal or window mask) carries m_s = -inf,
l_s = 0 and acc_s = 0 and weighs nothing; a row with no key at all (padding)
gets zeros, never NaN. Splits without any key tile (short context in a launch
sized for long ones) write nothing and are never read: ``merge_split_rows``
reads the ``num_live`` leading splits only, the ones that own tiles.

Who merges. The last split program of each (q-block, KV head) to finish,
found by a ticket from the group's counter (``runner/ticket_counters.py``:
the protocol, its memory order and the counters' invariant); it merges the
partials into ``out``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

# Rows x splits of accumulator the merging program loads at once (each row a
# head_dim vector): wide enough that a decode's splits arrive in one or two
# rounds of parallel loads, small enough to stay in registers.
MERGE_TILE = 64


class SplitPartials(NamedTuple):
    """The buffers of a split launch with S splits over T tokens and Hq heads.

    acc [T, Hq, S, D], max [T, Hq, S], sum [T, Hq, S]: contiguous float32,
    written and read within the launch. counters: int32, at least one per
    (q-program, KV head) of the launch (``triton_unified.split_counters_needed``),
    zero before the launch and after it.
    """

    acc: torch.Tensor
    max: torch.Tensor
    sum: torch.Tensor
    counters: torch.Tensor


def merge_config(num_splits: int, rows: int) -> dict[str, int]:
    """Constexprs of ``merge_split_rows`` for a launch of num_splits splits
    whose merging program covers ``rows`` rows (a power of two)."""
    splits_pad = triton.next_power_of_2(num_splits)
    return {"SPLITS_PAD": splits_pad, "SPLIT_CHUNK": min(splits_pad, max(1, MERGE_TILE // rows))}


@triton.jit
def merge_split_rows(
    out_ptr,
    out_rows,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_rows,
    row_mask,
    num_live,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
):
    """out[out_rows[r] + d] = the merge of splits 0 .. num_live - 1 of row r,
    for the ROWS rows r where row_mask holds.

    part_rows[r]: the index of row r's split 0 in part_max / part_sum (its
    splits follow it); its accumulators start at part_rows[r] * HEAD_DIM.
    Splits from num_live on own no key tile and are not read. The maxima and
    sums of all live splits come in one load; the accumulators in rounds of
    SPLIT_CHUNK splits, each round's loads independent of the others'.
    """
    splits = tl.arange(0, SPLITS_PAD)
    live = row_mask[:, None] & (splits < num_live)[None, :]
    stat = part_rows[:, None] + splits[None, :]
    m = tl.load(part_max_ptr + stat, mask=live, other=float("-inf"))
    l_s = tl.load(part_sum_ptr + stat, mask=live, other=0.0)
    m_max = tl.max(m, axis=1)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    total = tl.sum(tl.exp2(m - m_safe[:, None]) * l_s, axis=1)

    # A mask along dims only where they are padded: a mask constant along
    # dims lets the loads and the store use vectors.
    dims = tl.arange(0, DIM_PAD)
    dim_mask = dims < HEAD_DIM
    chunk = tl.arange(0, SPLIT_CHUNK)
    acc = tl.zeros([ROWS, DIM_PAD], dtype=tl.float32)
    for first in range(0, num_live, SPLIT_CHUNK):
        mask = row_mask[:, None] & (first + chunk < num_live)[None, :]
        index = part_rows[:, None] + first + chunk[None, :]
        m_c = tl.load(part_max_ptr + index, mask=mask, other=float("-inf"))
        acc_ptrs = part_acc_ptr + index[:, :, None] * HEAD_DIM + dims[None, None, :]
        if DIM_PAD == HEAD_DIM:
            a = tl.load(acc_ptrs, mask=mask[:, :, None], other=0.0)
        else:
            a = tl.load(acc_ptrs, mask=mask[:, :, None] & dim_mask[None, None, :], other=0.0)
        w = tl.exp2(m_c - m_safe[:, None])
        acc += tl.sum(a * w[:, :, None], axis=1)
    out = acc / tl.where(total > 0.0, total, 1.0)[:, None]
    out_ptrs = out_ptr + out_rows[:, None] + dims[None, :]
    if DIM_PAD == HEAD_DIM:
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
    else:
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty),
                 mask=row_mask[:, None] & dim_mask[None, :])
