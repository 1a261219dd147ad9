"""Last sampled and draft tokens into input_ids; the rows that get logits.

For batch row i (slot s = idx_mapping[i]) with end = qsl[i+1] and d draft
tokens (d = cu_num_logits[i+1] - cu_num_logits[i] - 1; d = 0 without drafts):

- logits_indices[cu_num_logits[i] + k] = end - 1 - d + k for k = 0 .. d: the
  last 1 + d tokens of every row, prefill rows included, in batch order.
- Only if seq_lens[i] > prefill_len[s] (the row decodes; seq_lens was written
  by prepare_pos_seq_lens earlier in the step): input_ids[end-1-d] =
  last_sampled_tokens[s] and input_ids[end-d : end] = draft_tokens[s, :d].
  This is how a decode gets its input token without the host ever seeing it.

Invariants the caller keeps: 1 + d <= the row's query length, d <=
draft_tokens.shape[1]; num_logits = num_reqs + sum(d) = cu_num_logits[num_reqs].
last_sampled_tokens may be [max_num_reqs] or [max_num_reqs, 1] (column 0 is read).
"""

from __future__ import annotations

import torch

from runner.kernels.dispatch import check_num_reqs, next_power_of_2, on_cuda, token_rows
from runner.triton_import import tl, triton


def _check(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    draft_tokens: torch.Tensor | None,
    cu_num_logits: torch.Tensor | None,
    logits_indices_out: torch.Tensor,
    num_reqs: int,
    num_logits: int,
) -> None:
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)
    if num_logits > logits_indices_out.shape[0]:
        raise ValueError(
            f"num_logits={num_logits} exceeds logits_indices_out size {logits_indices_out.shape[0]}"
        )
    if draft_tokens is None:
        if num_logits != num_reqs:
            raise ValueError(
                f"without draft tokens num_logits ({num_logits}) must equal num_reqs ({num_reqs})"
            )
    elif cu_num_logits is None:
        raise ValueError("cu_num_logits is required when draft_tokens is given")
    elif num_logits < num_reqs:
        raise ValueError(f"num_logits={num_logits} is below num_reqs={num_reqs}")


def _first_column(last_sampled_tokens: torch.Tensor) -> torch.Tensor:
    return last_sampled_tokens if last_sampled_tokens.dim() == 1 else last_sampled_tokens[:, 0]


def combine_sampled_and_draft_tokens_ref(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
    draft_tokens: torch.Tensor | None,
    cu_num_logits: torch.Tensor | None,
    logits_indices_out: torch.Tensor,
    num_reqs: int,
    num_logits: int,
) -> torch.Tensor:
    """Torch reference: fixed shapes (num_logits is host-known), no sync."""
    _check(
        idx_mapping,
        query_start_loc,
        draft_tokens,
        cu_num_logits,
        logits_indices_out,
        num_reqs,
        num_logits,
    )
    out = logits_indices_out[:num_logits]
    if num_reqs == 0:
        return out
    device = input_ids.device
    if draft_tokens is None:
        cu = torch.arange(num_reqs + 1, device=device, dtype=torch.int64)
    else:
        cu = cu_num_logits[: num_reqs + 1].to(torch.int64)
    j = torch.arange(num_logits, device=device, dtype=torch.int64)
    rows = torch.searchsorted(cu[1:], j, right=True).clamp(max=num_reqs - 1)
    k = j - cu[rows]
    num_drafts = cu[rows + 1] - cu[rows] - 1
    idx = query_start_loc.to(torch.int64)[rows + 1] - 1 - num_drafts + k
    out.copy_(idx)

    _write_decode_tokens(input_ids, idx_mapping, last_sampled_tokens, query_start_loc,
                         seq_lens, prefill_len, draft_tokens, cu, num_reqs)
    return out


def _write_decode_tokens(input_ids, idx_mapping, last_sampled_tokens, query_start_loc,
                         seq_lens, prefill_len, draft_tokens, cu, num_reqs: int) -> None:
    """Per token, not per row: a row with no tokens (padding) shares its
    ``end - 1`` with the row before it, and must not overwrite that row's
    token. Token t gets a value iff its row decodes and t is among the row's
    last 1 + d tokens."""
    num_tokens = input_ids.shape[0]
    rows = token_rows(query_start_loc, num_reqs, num_tokens)
    in_batch = rows < num_reqs
    rows = rows.clamp(max=num_reqs - 1)
    slots = idx_mapping.to(torch.int64)[rows]
    end = query_start_loc.to(torch.int64)[rows + 1]
    num_drafts = cu[rows + 1] - cu[rows] - 1
    k = torch.arange(num_tokens, device=input_ids.device) - (end - 1 - num_drafts)
    decoding = seq_lens.to(torch.int64)[rows] > prefill_len.to(torch.int64)[slots]
    values = _first_column(last_sampled_tokens)[slots]
    if draft_tokens is not None and draft_tokens.shape[1] > 0:
        drafts = draft_tokens[slots, (k - 1).clamp(0, draft_tokens.shape[1] - 1)]
        values = torch.where(k == 0, values, drafts)
    write = in_batch & decoding & (k >= 0)
    input_ids.copy_(torch.where(write, values.to(input_ids.dtype), input_ids))


@triton.jit
def _combine_kernel(
    input_ids_ptr,
    idx_mapping_ptr,
    last_sampled_ptr,
    last_sampled_stride,
    query_start_loc_ptr,
    seq_lens_ptr,
    prefill_len_ptr,
    draft_tokens_ptr,
    draft_tokens_stride,
    cu_num_logits_ptr,
    logits_indices_ptr,
    HAS_DRAFTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
    end = tl.load(query_start_loc_ptr + row + 1).to(tl.int64)
    k = tl.arange(0, BLOCK)
    if HAS_DRAFTS:
        first = tl.load(cu_num_logits_ptr + row).to(tl.int64)
        num_drafts = tl.load(cu_num_logits_ptr + row + 1).to(tl.int64) - first - 1
    else:
        first = row.to(tl.int64)
        num_drafts = 0
    mask = k <= num_drafts
    idx = end - 1 - num_drafts + k
    tl.store(logits_indices_ptr + first + k, idx, mask=mask)

    # Compared as a block (not a scalar) so the store mask stays boolean everywhere.
    seq_len = tl.load(seq_lens_ptr + row) + tl.zeros([BLOCK], dtype=tl.int32)
    decoding = seq_len > tl.load(prefill_len_ptr + slot)
    last = tl.load(last_sampled_ptr + slot * last_sampled_stride).to(tl.int64)
    if HAS_DRAFTS:
        draft_mask = mask & (k > 0)
        src = draft_tokens_ptr + slot * draft_tokens_stride + k - 1
        draft = tl.load(src, mask=draft_mask, other=0).to(tl.int64)
        value = tl.where(k == 0, last, draft)
    else:
        value = tl.zeros([BLOCK], dtype=tl.int64) + last
    value = value.to(input_ids_ptr.dtype.element_ty)
    tl.store(input_ids_ptr + idx, value, mask=mask & decoding)


def combine_sampled_and_draft_tokens_triton(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
    draft_tokens: torch.Tensor | None,
    cu_num_logits: torch.Tensor | None,
    logits_indices_out: torch.Tensor,
    num_reqs: int,
    num_logits: int,
) -> torch.Tensor:
    """Triton version: one program per batch row."""
    _check(
        idx_mapping,
        query_start_loc,
        draft_tokens,
        cu_num_logits,
        logits_indices_out,
        num_reqs,
        num_logits,
    )
    out = logits_indices_out[:num_logits]
    if num_reqs == 0:
        return out
    has_drafts = draft_tokens is not None
    max_drafts = draft_tokens.shape[1] if has_drafts else 0
    _combine_kernel[(num_reqs,)](
        input_ids,
        idx_mapping,
        last_sampled_tokens,
        last_sampled_tokens.stride(0),
        query_start_loc,
        seq_lens,
        prefill_len,
        draft_tokens if has_drafts else last_sampled_tokens,
        draft_tokens.stride(0) if has_drafts else 0,
        cu_num_logits if has_drafts else query_start_loc,
        logits_indices_out,
        HAS_DRAFTS=has_drafts,
        BLOCK=max(2, next_power_of_2(max_drafts + 1)),
    )
    return out


def combine_sampled_and_draft_tokens(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
    draft_tokens: torch.Tensor | None,
    cu_num_logits: torch.Tensor | None,
    logits_indices_out: torch.Tensor,
    num_reqs: int,
    num_logits: int,
) -> torch.Tensor:
    """Fill decode inputs and return logits_indices (Triton on CUDA, torch elsewhere)."""
    impl = (
        combine_sampled_and_draft_tokens_triton
        if on_cuda(input_ids)
        else combine_sampled_and_draft_tokens_ref
    )
    return impl(
        input_ids,
        idx_mapping,
        last_sampled_tokens,
        query_start_loc,
        seq_lens,
        prefill_len,
        draft_tokens,
        cu_num_logits,
        logits_indices_out,
        num_reqs,
        num_logits,
    )
