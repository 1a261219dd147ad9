"""Positions of the step's tokens and sequence lengths of its rows.

For batch row i (slot s = idx_mapping[i]) with query tokens t = qsl[i] .. qsl[i+1]-1:
positions[t] = num_computed_tokens[s] + (t - qsl[i]) and
seq_lens[i] = num_computed_tokens[s] + (qsl[i+1] - qsl[i]).
Padded rows num_reqs <= i < seq_lens.shape[0] get seq_lens[i] = 0 (CUDA graphs
replay over padded rows, and attention must see them as empty). Positions past
qsl[num_reqs] are left as they were.
"""

from __future__ import annotations

import torch

from runner.kernels.dispatch import check_num_reqs, on_cuda, token_rows
from runner.triton_import import tl, triton


def _check(
    idx_mapping: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_reqs: int
) -> None:
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)
    if num_reqs > seq_lens.shape[0]:
        raise ValueError(f"num_reqs={num_reqs} exceeds seq_lens size {seq_lens.shape[0]}")


def prepare_pos_seq_lens_ref(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    num_reqs: int,
) -> None:
    """Torch reference: fixed shapes, no sync."""
    _check(idx_mapping, query_start_loc, seq_lens, num_reqs)
    seq_lens[num_reqs:].zero_()
    if num_reqs == 0:
        return
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    computed = num_computed_tokens.to(torch.int64)[idx_mapping[:num_reqs].to(torch.int64)]
    seq_lens[:num_reqs] = (computed + qsl[1:] - qsl[:-1]).to(seq_lens.dtype)

    num_tokens = positions.shape[0]
    rows = token_rows(query_start_loc, num_reqs, num_tokens)
    in_batch = rows < num_reqs
    rows = rows.clamp(max=num_reqs - 1)
    tokens = torch.arange(num_tokens, device=positions.device, dtype=torch.int64)
    pos = computed[rows] + tokens - qsl[rows]
    positions.copy_(torch.where(in_batch, pos.to(positions.dtype), positions))


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
):
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


def prepare_pos_seq_lens_triton(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    num_reqs: int,
) -> None:
    """Triton version: one program per batch row, plus one for the padding."""
    _check(idx_mapping, query_start_loc, seq_lens, num_reqs)
    _pos_seq_lens_kernel[(num_reqs + 1,)](
        idx_mapping,
        query_start_loc,
        num_computed_tokens,
        positions,
        seq_lens,
        num_reqs,
        seq_lens.shape[0],
        BLOCK=1024,
    )


def prepare_pos_seq_lens(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    num_reqs: int,
) -> None:
    """Write positions and seq_lens (Triton on CUDA, torch elsewhere)."""
    impl = prepare_pos_seq_lens_triton if on_cuda(positions) else prepare_pos_seq_lens_ref
    impl(idx_mapping, query_start_loc, num_computed_tokens, positions, seq_lens, num_reqs)
