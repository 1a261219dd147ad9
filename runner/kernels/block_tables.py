"""Block tables in batch order and the KV-cache slot of every token.

gather_block_tables: out[i] = block_table[idx_mapping[i]] for i < num_reqs and
out[num_reqs : num_reqs_padded] = 0; returns out[:num_reqs_padded].

compute_slot_mappings: token t of batch row i, at position p = positions[t],
goes to slot block_table[idx_mapping[i], p // block_size] * block_size
+ p % block_size. Padding tokens num_tokens .. num_tokens_padded-1 get -1
(the attention backends skip them); returns slot_mapping[:num_tokens_padded].
"""

from __future__ import annotations

import torch

from runner.kernels.dispatch import check_num_reqs, on_cuda, token_rows
from runner.triton_import import tl, triton

PAD_SLOT_ID = -1


def _check_gather(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    num_reqs: int,
    num_reqs_padded: int,
) -> None:
    if not 0 <= num_reqs <= min(num_reqs_padded, idx_mapping.shape[0]):
        raise ValueError(
            f"need 0 <= num_reqs ({num_reqs}) <= num_reqs_padded ({num_reqs_padded}) and"
            f" <= idx_mapping size ({idx_mapping.shape[0]})"
        )
    if num_reqs_padded > out.shape[0]:
        raise ValueError(f"num_reqs_padded={num_reqs_padded} exceeds out rows {out.shape[0]}")
    if out.shape[1] != block_table.shape[1]:
        raise ValueError(f"out has {out.shape[1]} columns, block_table has {block_table.shape[1]}")


def gather_block_tables_ref(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    num_reqs: int,
    num_reqs_padded: int,
) -> torch.Tensor:
    """Torch reference."""
    _check_gather(block_table, idx_mapping, out, num_reqs, num_reqs_padded)
    out[:num_reqs] = block_table[idx_mapping[:num_reqs].to(torch.int64)]
    out[num_reqs:num_reqs_padded].zero_()
    return out[:num_reqs_padded]


@triton.jit
def _gather_block_tables_kernel(
    block_table_ptr,
    block_table_stride,
    idx_mapping_ptr,
    out_ptr,
    out_stride,
    num_reqs,
    num_cols,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    dst = out_ptr + row.to(tl.int64) * out_stride
    if row < num_reqs:
        slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
        src = block_table_ptr + slot * block_table_stride
        for off in range(0, num_cols, BLOCK):
            k = off + tl.arange(0, BLOCK)
            mask = k < num_cols
            tl.store(dst + k, tl.load(src + k, mask=mask), mask=mask)
    else:
        zero = tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty)
        for off in range(0, num_cols, BLOCK):
            k = off + tl.arange(0, BLOCK)
            tl.store(dst + k, zero, mask=k < num_cols)


def gather_block_tables_triton(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    num_reqs: int,
    num_reqs_padded: int,
) -> torch.Tensor:
    """Triton version: one program per (padded) batch row."""
    _check_gather(block_table, idx_mapping, out, num_reqs, num_reqs_padded)
    if block_table.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("block_table and out rows must be contiguous")
    if num_reqs_padded > 0:
        _gather_block_tables_kernel[(num_reqs_padded,)](
            block_table,
            block_table.stride(0),
            idx_mapping,
            out,
            out.stride(0),
            num_reqs,
            block_table.shape[1],
            BLOCK=1024,
        )
    return out[:num_reqs_padded]


def gather_block_tables(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    num_reqs: int,
    num_reqs_padded: int,
) -> torch.Tensor:
    """Gather the batch's block-table rows (Triton on CUDA, torch elsewhere)."""
    impl = gather_block_tables_triton if on_cuda(out) else gather_block_tables_ref
    return impl(block_table, idx_mapping, out, num_reqs, num_reqs_padded)


def _check_slots(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_size: int,
    slot_mapping: torch.Tensor,
    num_reqs: int,
    num_tokens: int,
    num_tokens_padded: int,
) -> None:
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if not 0 <= num_tokens <= num_tokens_padded <= slot_mapping.shape[0]:
        raise ValueError(
            f"need 0 <= num_tokens ({num_tokens}) <= num_tokens_padded ({num_tokens_padded})"
            f" <= slot_mapping size ({slot_mapping.shape[0]})"
        )
    if num_reqs == 0 and num_tokens > 0:
        raise ValueError(f"num_tokens={num_tokens} with an empty batch")


def compute_slot_mappings_ref(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    slot_mapping: torch.Tensor,
    num_reqs: int,
    num_tokens: int,
    num_tokens_padded: int,
) -> torch.Tensor:
    """Torch reference: fixed shapes (num_tokens is host-known), no sync.

    Tokens below num_tokens that belong to no row (at or past
    query_start_loc[num_reqs]) are left as they are, as the Triton kernel
    leaves them: a CUDA graph fills them with -1 first.
    """
    _check_slots(
        idx_mapping,
        query_start_loc,
        block_size,
        slot_mapping,
        num_reqs,
        num_tokens,
        num_tokens_padded,
    )
    slot_mapping[num_tokens:num_tokens_padded] = PAD_SLOT_ID
    if num_tokens == 0:
        return slot_mapping[:num_tokens_padded]
    rows = token_rows(query_start_loc, num_reqs, num_tokens)
    in_a_row = rows < num_reqs
    req_slots = idx_mapping[:num_reqs].to(torch.int64)[rows.clamp(max=num_reqs - 1)]
    pos = torch.where(in_a_row, positions[:num_tokens].to(torch.int64), 0)
    blocks = block_table[req_slots, pos // block_size].to(torch.int64)
    slots = (blocks * block_size + pos % block_size).to(slot_mapping.dtype)
    slot_mapping[:num_tokens] = torch.where(in_a_row, slots, slot_mapping[:num_tokens])
    return slot_mapping[:num_tokens_padded]


@triton.jit
def _slot_mappings_kernel(
    block_table_ptr,
    block_table_stride,
    idx_mapping_ptr,
    query_start_loc_ptr,
    positions_ptr,
    slot_mapping_ptr,
    block_size,
    num_reqs,
    num_tokens,
    num_tokens_padded,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    if row == num_reqs:
        # The last program writes the padding.
        pad = tl.full([BLOCK], -1, dtype=tl.int64)
        for off in range(num_tokens, num_tokens_padded, BLOCK):
            k = off + tl.arange(0, BLOCK)
            tl.store(slot_mapping_ptr + k, pad, mask=k < num_tokens_padded)
    else:
        slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
        table = block_table_ptr + slot * block_table_stride
        start = tl.load(query_start_loc_ptr + row)
        end = tl.load(query_start_loc_ptr + row + 1)
        for off in range(start, end, BLOCK):
            t = off + tl.arange(0, BLOCK)
            mask = t < end
            pos = tl.load(positions_ptr + t, mask=mask, other=0).to(tl.int64)
            block = tl.load(table + pos // block_size, mask=mask, other=0).to(tl.int64)
            tl.store(slot_mapping_ptr + t, block * block_size + pos % block_size, mask=mask)


def compute_slot_mappings_triton(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    slot_mapping: torch.Tensor,
    num_reqs: int,
    num_tokens: int,
    num_tokens_padded: int,
) -> torch.Tensor:
    """Triton version: one program per batch row, plus one for the padding."""
    _check_slots(
        idx_mapping,
        query_start_loc,
        block_size,
        slot_mapping,
        num_reqs,
        num_tokens,
        num_tokens_padded,
    )
    if block_table.stride(1) != 1:
        raise ValueError("block_table rows must be contiguous")
    _slot_mappings_kernel[(num_reqs + 1,)](
        block_table,
        block_table.stride(0),
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        block_size,
        num_reqs,
        num_tokens,
        num_tokens_padded,
        BLOCK=1024,
    )
    return slot_mapping[:num_tokens_padded]


def compute_slot_mappings(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    slot_mapping: torch.Tensor,
    num_reqs: int,
    num_tokens: int,
    num_tokens_padded: int,
) -> torch.Tensor:
    """KV-cache slot of every token, -1 for padding (Triton on CUDA, torch elsewhere)."""
    impl = compute_slot_mappings_triton if on_cuda(slot_mapping) else compute_slot_mappings_ref
    return impl(
        block_table,
        idx_mapping,
        query_start_loc,
        positions,
        block_size,
        slot_mapping,
        num_reqs,
        num_tokens,
        num_tokens_padded,
    )
