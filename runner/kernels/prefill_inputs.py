"""Prompt tokens of prefilling requests into the step's input_ids.

For batch row i (slot s = idx_mapping[i]) the query tokens are
t = qsl[i] .. qsl[i+1]-1 at positions p = num_computed_tokens[s] + (t - qsl[i]).
Where p < prefill_len[s], input_ids[t] = all_token_ids[s, p]; every other
entry of input_ids is left as it was (decode tokens come from
combine_sampled_and_draft_tokens). all_token_ids may be a UVA view of pinned
host memory: the kernel then reads the prompt straight from host memory.
"""

from __future__ import annotations

import torch

from runner.kernels.dispatch import check_num_reqs, on_cuda, token_rows
from runner.triton_import import tl, triton


def prepare_prefill_inputs_ref(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    all_token_ids: torch.Tensor,
    prefill_len: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    num_reqs: int,
) -> None:
    """Torch reference: fixed shapes over the whole input_ids buffer, no sync."""
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)
    if num_reqs == 0:
        return
    num_tokens = input_ids.shape[0]
    rows = token_rows(query_start_loc, num_reqs, num_tokens)
    in_batch = rows < num_reqs
    rows = rows.clamp(max=num_reqs - 1)
    slots = idx_mapping[:num_reqs].to(torch.int64)[rows]
    starts = query_start_loc[:num_reqs].to(torch.int64)[rows]
    tokens = torch.arange(num_tokens, device=input_ids.device, dtype=torch.int64)
    pos = num_computed_tokens.to(torch.int64)[slots] + (tokens - starts)
    write = in_batch & (pos < prefill_len.to(torch.int64)[slots])
    pos = pos.clamp(0, all_token_ids.shape[1] - 1)
    prompt = all_token_ids[slots, pos].to(input_ids.dtype)
    input_ids.copy_(torch.where(write, prompt, input_ids))


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
):
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


def prepare_prefill_inputs_triton(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    all_token_ids: torch.Tensor,
    prefill_len: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    num_reqs: int,
) -> None:
    """Triton version: one program per batch row."""
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)
    if num_reqs == 0:
        return
    if all_token_ids.stride(1) != 1:
        raise ValueError("all_token_ids rows must be contiguous")
    _prefill_inputs_kernel[(num_reqs,)](
        input_ids,
        idx_mapping,
        query_start_loc,
        all_token_ids,
        all_token_ids.stride(0),
        prefill_len,
        num_computed_tokens,
        BLOCK=1024,
    )


def prepare_prefill_inputs(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    all_token_ids: torch.Tensor,
    prefill_len: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    num_reqs: int,
) -> None:
    """Write prompt tokens into input_ids (Triton on CUDA, torch elsewhere)."""
    impl = prepare_prefill_inputs_triton if on_cuda(input_ids) else prepare_prefill_inputs_ref
    impl(
        input_ids,
        idx_mapping,
        query_start_loc,
        all_token_ids,
        prefill_len,
        num_computed_tokens,
        num_reqs,
    )
