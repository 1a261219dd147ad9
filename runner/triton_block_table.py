"""The block-table kernels of runner/block_table.py in Triton, with the same
signatures as their torch references there; they launch with programmatic
dependent launch as the input kernels do (``runner/triton_input_batch.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.ops import pdl_launch
from runner.triton_dependent_launch import wait_for_previous_kernel


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
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
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


def gather_block_tables_triton(block_table: torch.Tensor, idx_mapping: torch.Tensor,
                               out: torch.Tensor, num_reqs: int, num_reqs_padded: int
                               ) -> torch.Tensor:
    """``gather_block_tables_ref``: one program per (padded) batch row."""
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
            **pdl_launch(out.device),
        )
    return out[:num_reqs_padded]


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
    num_tokens_padded,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    if row == num_reqs:
        # The last program writes the padding: the tokens past the rows' own,
        # from their end on the device (a graph's real token count).
        pad = tl.full([BLOCK], -1, dtype=tl.int64)
        for off in range(tl.load(query_start_loc_ptr + num_reqs), num_tokens_padded, BLOCK):
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


def compute_slot_mappings_triton(block_table: torch.Tensor, idx_mapping: torch.Tensor,
                                 query_start_loc: torch.Tensor, positions: torch.Tensor,
                                 block_size: int, slot_mapping: torch.Tensor, num_reqs: int,
                                 num_tokens: int, num_tokens_padded: int) -> torch.Tensor:
    """``compute_slot_mappings_ref``: one program per batch row, plus one for the padding
    (which starts where the device's query_start_loc says the rows end:
    ``num_tokens`` is only checked)."""
    _slot_mappings_kernel[(num_reqs + 1,)](
        block_table,
        block_table.stride(0),
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        block_size,
        num_reqs,
        num_tokens_padded,
        BLOCK=1024,
        **pdl_launch(slot_mapping.device),
    )
    return slot_mapping[:num_tokens_padded]
