"""``ngram_propose_ref`` (runner/spec_decode/ngram.py) in Triton: one
program per batch row scans the row's history in blocks, once per n-gram
size (unrolled: sizes are at most MAX_SPECULATIVE_TOKENS)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _ngram_kernel(
    tokens_ptr,
    tokens_stride,
    width,
    idx_mapping_ptr,
    num_computed_ptr,
    drafts_ptr,
    drafts_stride,
    num_drafts,
    MIN_N: tl.constexpr,
    MAX_N: tl.constexpr,
    BLOCK: tl.constexpr,
    DRAFT_BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
    h = tl.minimum(tl.load(num_computed_ptr + slot).to(tl.int64) + 1, width)
    base = tokens_ptr + slot * tokens_stride
    offs = tl.arange(0, BLOCK)
    best = tl.zeros([BLOCK], dtype=tl.int64) - 1  # every lane holds the same value
    for n in tl.static_range(MAX_N, MIN_N - 1, -1):  # longest n-gram first
        latest = tl.zeros([BLOCK], dtype=tl.int64) - 1
        for start in range(0, h - 1, BLOCK):
            ends = start + offs
            ok = (ends >= n - 1) & (ends <= h - 2)
            for q in tl.static_range(n):
                suffix = tl.load(base + tl.maximum(h - n + q, 0))
                window = tl.load(base + ends - n + 1 + q, mask=ok, other=-1)
                ok = ok & (window == suffix)
            found = tl.max(tl.where(ok, ends, -1), axis=0)
            latest = tl.maximum(latest, found)
        best = tl.where(best < 0, latest, best)
    best_end = tl.max(best, axis=0)
    j = tl.arange(0, DRAFT_BLOCK)
    period = tl.maximum(h - 1 - best_end, 1)
    src = tl.where(best_end >= 0, best_end + 1 + j % period, h - 1)
    draft = tl.load(base + src, mask=j < num_drafts, other=0)
    tl.store(drafts_ptr + slot * drafts_stride + j, draft.to(tl.int64), mask=j < num_drafts)


def ngram_propose_triton(all_token_ids: torch.Tensor, idx_mapping: torch.Tensor,
                         num_computed_tokens: torch.Tensor, draft_tokens: torch.Tensor,
                         num_reqs: int, min_n: int, max_n: int) -> None:
    """``ngram_propose_ref``: one program per batch row."""
    if num_reqs == 0:
        return
    k = draft_tokens.shape[1]
    _ngram_kernel[(num_reqs,)](
        all_token_ids, all_token_ids.stride(0), all_token_ids.shape[1], idx_mapping,
        num_computed_tokens, draft_tokens, draft_tokens.stride(0), k,
        MIN_N=min_n, MAX_N=max_n, BLOCK=256, DRAFT_BLOCK=triton.next_power_of_2(k),
    )
