"""Block tables: the KV blocks of each slot, mirrored on the device.

The scheduler owns the block ids; the runner only mirrors them. Writes are
staged on the host and applied with one launch per step. Each step gathers
the rows of the batch's slots (in batch order) into a second persistent
tensor and computes the slot mapping, both on the device.
"""

from __future__ import annotations

import numpy as np
import torch

from runner.ops import device_ops
from runner.staged_write import StagedWriteTensor


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
        # One extra row for the padding slot (see runner.states): always zero.
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
        if not block_ids:
            return
        start = int(self.num_blocks_np[slot])
        if start + len(block_ids) > self.max_num_blocks_per_req:
            raise ValueError(
                f"slot {slot}: {start + len(block_ids)} blocks exceed the table width "
                f"{self.max_num_blocks_per_req} (max_model_len / block_size)"
            )
        self.block_table.stage_write(slot, start, block_ids)
        self.num_blocks_np[slot] = start + len(block_ids)

    def apply_staged_writes(self) -> None:
        self.block_table.apply_write()

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
