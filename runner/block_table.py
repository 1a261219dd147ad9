"""Block tables: the KV blocks of each slot, mirrored on the device.

The scheduler owns the block ids; the runner only mirrors them. Writes are
staged on the host and applied with one launch per step. Each step gathers
the rows of the batch's slots (in batch order) into a second persistent
tensor and computes the slot mapping, both on the device, with the kernels
below (torch references; their Triton versions are in triton_block_table.py):

gather_block_tables: out[i] = block_table[idx_mapping[i]] for i < num_reqs and
out[num_reqs : num_reqs_padded] = 0; returns out[:num_reqs_padded].

compute_slot_mappings: token t of batch row i, at position p = positions[t],
goes to slot block_table[idx_mapping[i], p // block_size] * block_size
+ p % block_size. Padding tokens num_tokens .. num_tokens_padded-1 get -1
(the attention backends skip them); returns slot_mapping[:num_tokens_padded].
"""

from __future__ import annotations

import numpy as np
import torch

from runner.input_batch import check_num_reqs, token_rows
from runner.ops import device_ops
from runner.staged_write import StagedWriteTensor

PAD_SLOT_ID = -1


class BlockTables:
    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        device: torch.device,
    ):
        self.ops = device_ops(device)
        self.block_size = block_size
        self.max_num_blocks_per_req = max_num_blocks_per_req
        # One extra row for the padding slot (see runner.request_state): always zero.
        self.block_table = StagedWriteTensor(
            (max_num_reqs + 1, max_num_blocks_per_req), torch.int32, device
        )
        self.num_blocks_np = np.zeros(max_num_reqs + 1, dtype=np.int32)
        self.batch_block_table = torch.zeros(
            max_num_reqs, max_num_blocks_per_req, dtype=torch.int32, device=device
        )
        self.slot_mapping = torch.full(
            (max_num_batched_tokens,), -1, dtype=torch.int64, device=device
        )

    def add_request(self, slot: int, block_ids: list[int]) -> None:
        self.num_blocks_np[slot] = 0
        self.append_blocks(slot, block_ids)

    def append_blocks(self, slot: int, block_ids: list[int]) -> None:
        """Stage ``block_ids`` after the slot's blocks (``plan_check`` has
        checked that they fit the table's width)."""
        if not block_ids:
            return
        start = int(self.num_blocks_np[slot])
        self.block_table.stage_write(slot, start, block_ids)
        self.num_blocks_np[slot] = start + len(block_ids)

    @property
    def staged_tensors(self) -> tuple[StagedWriteTensor, ...]:
        """The tensors whose writes are staged on the host."""
        return (self.block_table,)

    def gather(self, idx_mapping: torch.Tensor, num_reqs: int, num_reqs_padded: int):
        """Rows of the batch's slots, in batch order; padded rows zeroed."""
        return self.ops.gather_block_tables(
            self.block_table.gpu, idx_mapping, self.batch_block_table, num_reqs, num_reqs_padded
        )

    def compute_slot_mapping(
        self,
        idx_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        positions: torch.Tensor,
        num_reqs: int,
        num_tokens: int,
        num_tokens_padded: int,
    ) -> torch.Tensor:
        """block * block_size + offset for each token; -1 for padding."""
        return self.ops.compute_slot_mappings(
            self.block_table.gpu,
            idx_mapping,
            query_start_loc,
            positions,
            self.block_size,
            self.slot_mapping,
            num_reqs,
            num_tokens,
            num_tokens_padded,
        )


def check_gather_block_tables(block_table: torch.Tensor, idx_mapping: torch.Tensor,
                              out: torch.Tensor, num_reqs: int, num_reqs_padded: int) -> None:
    """Raise ValueError unless the sizes fit (both versions)."""
    if not 0 <= num_reqs <= min(num_reqs_padded, idx_mapping.shape[0]):
        raise ValueError(
            f"need 0 <= num_reqs ({num_reqs}) <= num_reqs_padded ({num_reqs_padded}) and"
            f" <= idx_mapping size ({idx_mapping.shape[0]})"
        )
    if num_reqs_padded > out.shape[0]:
        raise ValueError(f"num_reqs_padded={num_reqs_padded} exceeds out rows {out.shape[0]}")
    if out.shape[1] != block_table.shape[1]:
        raise ValueError(f"out has {out.shape[1]} columns, block_table has {block_table.shape[1]}")
    if block_table.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("block_table and out rows must be contiguous")


def gather_block_tables_ref(block_table: torch.Tensor, idx_mapping: torch.Tensor,
                            out: torch.Tensor, num_reqs: int, num_reqs_padded: int) -> torch.Tensor:
    """Torch reference."""
    out[:num_reqs] = block_table[idx_mapping[:num_reqs].to(torch.int64)]
    out[num_reqs:num_reqs_padded].zero_()
    return out[:num_reqs_padded]


def check_compute_slot_mappings(block_table: torch.Tensor, idx_mapping: torch.Tensor,
                                query_start_loc: torch.Tensor, block_size: int,
                                slot_mapping: torch.Tensor, num_reqs: int, num_tokens: int,
                                num_tokens_padded: int) -> None:
    """Raise ValueError unless the sizes fit (both versions)."""
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
    if block_table.stride(1) != 1:
        raise ValueError("block_table rows must be contiguous")


def compute_slot_mappings_ref(block_table: torch.Tensor, idx_mapping: torch.Tensor,
                              query_start_loc: torch.Tensor, positions: torch.Tensor,
                              block_size: int, slot_mapping: torch.Tensor, num_reqs: int,
                              num_tokens: int, num_tokens_padded: int) -> torch.Tensor:
    """Torch reference: fixed shapes, no sync.

    Every token below num_tokens_padded that belongs to no row (at or past
    query_start_loc[num_reqs], read on the device) gets PAD_SLOT_ID: a CUDA
    graph's padded tokens, whose count only the device knows, write no KV.
    """
    if num_reqs == 0:
        slot_mapping[:num_tokens_padded] = PAD_SLOT_ID
        return slot_mapping[:num_tokens_padded]
    rows = token_rows(query_start_loc, num_reqs, num_tokens_padded)
    in_a_row = rows < num_reqs
    req_slots = idx_mapping[:num_reqs].to(torch.int64)[rows.clamp(max=num_reqs - 1)]
    pos = torch.where(in_a_row, positions[:num_tokens_padded].to(torch.int64), 0)
    blocks = block_table[req_slots, pos // block_size].to(torch.int64)
    slots = (blocks * block_size + pos % block_size).to(slot_mapping.dtype)
    slot_mapping[:num_tokens_padded] = torch.where(in_a_row, slots, PAD_SLOT_ID)
    return slot_mapping[:num_tokens_padded]
