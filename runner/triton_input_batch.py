"""The step-input kernels of runner/input_batch.py in Triton, with the same
signatures as their torch references there. They launch with programmatic
dependent launch where the device has it (``runner/triton_dependent_launch.py``):
each waits for the kernel before it before it reads anything, and lets the
next one start at once, so the chain of small launches that begins and
ends a step hides its launches as the forward's kernels do."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.ops import pdl_launch
from runner.triton_dependent_launch import wait_for_previous_kernel


@triton.jit
def _prefill_inputs_kernel(
    input_ids_ptr,
    idx_mapping_ptr,
    query_start_loc_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    prefill_len_ptr,
    num_computed_tokens_ptr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
    start = tl.load(query_start_loc_ptr + row)
    end = tl.load(query_start_loc_ptr + row + 1)
    computed = tl.load(num_computed_tokens_ptr + slot)
    prefill = tl.load(prefill_len_ptr + slot)
    # Tokens of this row still inside the prefill; <= 0 for a decode.
    count = tl.minimum(end - start, prefill - computed)
    src = all_token_ids_ptr + slot * all_token_ids_stride + computed
    for off in range(0, count, BLOCK):
        k = off + tl.arange(0, BLOCK)
        mask = k < count
        token = tl.load(src + k, mask=mask)
        tl.store(input_ids_ptr + start + k, token, mask=mask)


def prepare_prefill_inputs_triton(input_ids: torch.Tensor, idx_mapping: torch.Tensor,
                                  query_start_loc: torch.Tensor, all_token_ids: torch.Tensor,
                                  prefill_len: torch.Tensor, num_computed_tokens: torch.Tensor,
                                  num_reqs: int) -> None:
    """``prepare_prefill_inputs_ref``: one program per batch row."""
    if num_reqs == 0:
        return
    _prefill_inputs_kernel[(num_reqs,)](
        input_ids,
        idx_mapping,
        query_start_loc,
        all_token_ids,
        all_token_ids.stride(0),
        prefill_len,
        num_computed_tokens,
        BLOCK=1024,
        **pdl_launch(input_ids.device),
    )


@triton.jit
def _pos_seq_lens_kernel(
    idx_mapping_ptr,
    query_start_loc_ptr,
    num_computed_tokens_ptr,
    positions_ptr,
    seq_lens_ptr,
    num_reqs,
    num_seq_lens,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    if row == num_reqs:
        # The last program zeroes the padded rows.
        for off in range(num_reqs, num_seq_lens, BLOCK):
            k = off + tl.arange(0, BLOCK)
            zero = tl.zeros([BLOCK], dtype=seq_lens_ptr.dtype.element_ty)
            tl.store(seq_lens_ptr + k, zero, mask=k < num_seq_lens)
    else:
        slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
        start = tl.load(query_start_loc_ptr + row)
        end = tl.load(query_start_loc_ptr + row + 1)
        computed = tl.load(num_computed_tokens_ptr + slot)
        count = end - start
        tl.store(seq_lens_ptr + row, computed + count)
        for off in range(0, count, BLOCK):
            k = off + tl.arange(0, BLOCK)
            pos = (computed + k).to(tl.int64)
            tl.store(positions_ptr + start + k, pos, mask=k < count)


def prepare_pos_seq_lens_triton(idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                                num_computed_tokens: torch.Tensor, positions: torch.Tensor,
                                seq_lens: torch.Tensor, num_reqs: int) -> None:
    """``prepare_pos_seq_lens_ref``: one program per batch row, plus one for the padding."""
    _pos_seq_lens_kernel[(num_reqs + 1,)](
        idx_mapping,
        query_start_loc,
        num_computed_tokens,
        positions,
        seq_lens,
        num_reqs,
        seq_lens.shape[0],
        BLOCK=1024,
        **pdl_launch(positions.device),
    )


@triton.jit
def _combine_kernel(
    input_ids_ptr,
    idx_mapping_ptr,
    last_sampled_ptr,
    last_sampled_stride,
    query_start_loc_ptr,
    seq_lens_ptr,
    prefill_len_ptr,
    logits_indices_ptr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
    end = tl.load(query_start_loc_ptr + row + 1).to(tl.int64)
    k = tl.arange(0, BLOCK)
    mask = k == 0
    idx = end - 1 + k
    tl.store(logits_indices_ptr + row.to(tl.int64) + k, idx, mask=mask)

    # Compared as a block (not a scalar) so the store mask stays boolean everywhere.
    seq_len = tl.load(seq_lens_ptr + row) + tl.zeros([BLOCK], dtype=tl.int32)
    decoding = seq_len > tl.load(prefill_len_ptr + slot)
    last = tl.load(last_sampled_ptr + slot * last_sampled_stride).to(tl.int64)
    value = (tl.zeros([BLOCK], dtype=tl.int64) + last).to(input_ids_ptr.dtype.element_ty)
    tl.store(input_ids_ptr + idx, value, mask=mask & decoding)


def combine_sampled_tokens_triton(input_ids: torch.Tensor, idx_mapping: torch.Tensor,
                                  last_sampled_tokens: torch.Tensor, query_start_loc: torch.Tensor,
                                  seq_lens: torch.Tensor, prefill_len: torch.Tensor,
                                  logits_indices_out: torch.Tensor, num_reqs: int) -> torch.Tensor:
    """``combine_sampled_tokens_ref``: one program per batch row."""
    out = logits_indices_out[:num_reqs]
    if num_reqs == 0:
        return out
    _combine_kernel[(num_reqs,)](
        input_ids,
        idx_mapping,
        last_sampled_tokens,
        last_sampled_tokens.stride(0),
        query_start_loc,
        seq_lens,
        prefill_len,
        logits_indices_out,
        BLOCK=2,
        **pdl_launch(input_ids.device),
    )
    return out


@triton.jit
def _finish_rows_kernel(
    idx_mapping_ptr,
    seq_lens_ptr,
    positions_ptr,
    logits_indices_ptr,
    prefill_len_ptr,
    num_computed_ptr,
    idx_out_ptr,
    next_positions_ptr,
    sample_mask_ptr,
    num_reqs,
    num_logits,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row = i < num_reqs
    slot = tl.load(idx_mapping_ptr + i, mask=row, other=0).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + i, mask=row, other=0)
    tl.store(idx_out_ptr + i, slot, mask=row)
    tl.store(num_computed_ptr + slot, seq_len, mask=row)
    prefill = tl.load(prefill_len_ptr + slot, mask=row, other=0)
    tl.store(sample_mask_ptr + i, seq_len >= prefill, mask=row)
    logit = i < num_logits
    token = tl.load(logits_indices_ptr + i, mask=logit, other=0)
    position = tl.load(positions_ptr + token, mask=logit, other=0)
    tl.store(next_positions_ptr + i, position + 1, mask=logit)


def finish_step_rows_triton(idx_mapping: torch.Tensor, seq_lens: torch.Tensor,
                            positions: torch.Tensor, logits_indices: torch.Tensor,
                            prefill_len: torch.Tensor, num_computed_tokens: torch.Tensor,
                            num_reqs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``finish_step_rows_ref`` in one launch (the reference's seven small
    torch kernels are as many boundaries in every decode step)."""
    num_logits = logits_indices.shape[0]
    device = idx_mapping.device
    idx = torch.empty(num_reqs, dtype=torch.int64, device=device)
    next_positions = torch.empty(num_logits, dtype=positions.dtype, device=device)
    sample_mask = torch.empty(num_reqs, dtype=torch.bool, device=device)
    block = 128
    programs = triton.cdiv(max(num_reqs, num_logits), block)
    if programs:
        _finish_rows_kernel[(programs,)](
            idx_mapping, seq_lens, positions, logits_indices, prefill_len, num_computed_tokens,
            idx, next_positions, sample_mask, num_reqs, num_logits, BLOCK=block,
            **pdl_launch(device))
    return idx, next_positions, sample_mask


@triton.jit
def _combine_drafts_kernel(
    input_ids_ptr,
    idx_mapping_ptr,
    last_sampled_ptr,
    last_sampled_stride,
    draft_ptr,
    draft_stride,
    query_start_loc_ptr,
    cu_num_logits_ptr,
    seq_lens_ptr,
    prefill_len_ptr,
    logits_indices_ptr,
    num_drafts,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
    start = tl.load(query_start_loc_ptr + row).to(tl.int64)
    end = tl.load(query_start_loc_ptr + row + 1).to(tl.int64)
    lstart = tl.load(cu_num_logits_ptr + row).to(tl.int64)
    lend = tl.load(cu_num_logits_ptr + row + 1).to(tl.int64)
    k = tl.arange(0, BLOCK)
    tl.store(logits_indices_ptr + lstart + k, end - (lend - lstart) + k, mask=k < lend - lstart)

    count = end - start
    # Compared as a block (not a scalar) so the store mask stays boolean everywhere.
    computed = (tl.load(seq_lens_ptr + row) + tl.zeros([BLOCK], dtype=tl.int32)) - count
    decoding = computed >= tl.load(prefill_len_ptr + slot)
    last = tl.load(last_sampled_ptr + slot * last_sampled_stride).to(tl.int64)
    draft = tl.load(draft_ptr + slot * draft_stride + k - 1, mask=(k >= 1) & (k < count) & (k <= num_drafts),
                    other=0).to(tl.int64)
    value = tl.where(k == 0, last, draft).to(input_ids_ptr.dtype.element_ty)
    tl.store(input_ids_ptr + start + k, value, mask=(k < count) & decoding)


def combine_draft_tokens_triton(input_ids: torch.Tensor, idx_mapping: torch.Tensor,
                                last_sampled_tokens: torch.Tensor, draft_tokens: torch.Tensor,
                                query_start_loc: torch.Tensor, cu_num_logits: torch.Tensor,
                                seq_lens: torch.Tensor, prefill_len: torch.Tensor,
                                logits_indices_out: torch.Tensor, num_reqs: int) -> None:
    """``combine_draft_tokens_ref``: one program per batch row. A decoding
    row has at most 1 + k tokens and at most that many logits rows, so one
    block covers them (a prefill row has one logits row)."""
    if num_reqs == 0:
        return
    _combine_drafts_kernel[(num_reqs,)](
        input_ids,
        idx_mapping,
        last_sampled_tokens,
        last_sampled_tokens.stride(0),
        draft_tokens,
        draft_tokens.stride(0),
        query_start_loc,
        cu_num_logits,
        seq_lens,
        prefill_len,
        logits_indices_out,
        draft_tokens.shape[1],
        BLOCK=triton.next_power_of_2(draft_tokens.shape[1] + 1),
        **pdl_launch(input_ids.device),
    )
