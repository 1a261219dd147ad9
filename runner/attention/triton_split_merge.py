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

Who merges. The last split program of each (q-block, KV head) to finish:
every split program stores its partials, then (a CTA barrier, so all its
threads' stores come first, and an acquire-release atomic at GPU scope) takes
a ticket from the group's counter; the one that draws num_splits - 1 knows
that every other split has released its partials, and its acquire makes them
visible to it. It merges them into ``out`` and puts the counter back to 0.
Programs only count and never wait on one another, so any schedule finishes.

Invariant of the counters (``SplitCounters``): zero between launches. They
are zeroed once when allocated; each launch leaves every counter it used at
0 again, so neither eager steps nor CUDA-graph replays clear them. Launches
sharing counters must not overlap: they run on one stream, where a kernel
launched with PDL touches nothing before the kernel before it has completed
(``runner/triton_dependent_launch.py``).
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


class SplitCounters:
    """Per device, the counters that split launches take tickets from.

    ``at_least(n, device)`` returns a zeroed int32 buffer of at least n
    counters, allocated once and grown when a launch needs more. An outgrown
    buffer stays referenced here: a CUDA graph captured with it keeps its
    address. Growing while a graph is captured would record the zeroing in
    the graph (correct, one memset per replay); the backend asks on every
    launch, so the eager warm-up before a capture has grown them already.
    """

    def __init__(self) -> None:
        self._current: dict[torch.device, torch.Tensor] = {}
        self._outgrown: list[torch.Tensor] = []

    def at_least(self, n: int, device: torch.device) -> torch.Tensor:
        counters = self._current.get(device)
        if counters is None or counters.numel() < n:
            if counters is not None:
                self._outgrown.append(counters)
            size = max(n, 1024, 2 * (0 if counters is None else counters.numel()))
            counters = torch.zeros(size, dtype=torch.int32, device=device)
            self._current[device] = counters
        return counters


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


@triton.jit
def finish_split(
    counter_ptr,
    num_splits,
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
    """Count this split program's partials as stored; the group's last one
    merges all of them (``merge_split_rows``) and resets the counter to 0.

    The barrier puts every thread's partial stores before the atomic (Triton
    issues a scalar atomic from one thread); acq_rel at GPU scope releases
    them to the last program and makes the others' visible to it.
    """
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == num_splits - 1:
        merge_split_rows(out_ptr, out_rows, part_acc_ptr, part_max_ptr, part_sum_ptr, part_rows,
                         row_mask, num_live, ROWS, HEAD_DIM, DIM_PAD, SPLITS_PAD, SPLIT_CHUNK)
        tl.store(counter_ptr, 0)
