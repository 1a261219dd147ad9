"""Persistent per-request state: one row (slot) per request, kept between steps.

Invariants:
- ``free_indices`` starts as ``[0 .. max_num_reqs-1]``; ``add_request`` pops
  the last, ``remove_request`` appends. The first request gets slot
  ``max_num_reqs - 1``; the slot freed last is reused first.
- Host arrays (``*_np``) are the source of truth for what the host must know
  (prompt and prefill lengths); device copies are updated only by staged
  writes applied once per step, never by a blocking copy.
- ``last_sampled_tokens`` lives on the device only: the next step's decode
  input is read from it, so the host need not have seen the token yet.
- With speculative decoding (``num_speculative_tokens`` k > 0):
  ``draft_tokens`` [rows, k] holds each slot's drafts for its next step,
  written on the device by the proposer; ``all_token_ids`` lives in device
  memory (the n-gram proposer reads it every step) and holds every token of
  the request, outputs included, each written on the device when sampled;
  ``num_computed_tokens`` on the device is the truth and the host mirror
  ``num_computed_tokens_np`` an upper bound (the scheduler's count, which
  exceeds the truth by the drafts rejected in a step still in flight).
- Every per-slot tensor has one extra row, ``pad_slot = max_num_reqs``,
  never given to a request: its lengths stay 0 and its block-table row
  stays zero, so a padded batch row mapped to it has seq_len 0 and writes
  no KV (CUDA graphs run padded batches).
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.config import TOKEN_POOLING_TASKS
from ipc.messages import NewRequestData
from runner.staged_write import StagedWriteTensor


class RequestState:
    def __init__(self, max_num_reqs: int, max_model_len: int, device: torch.device,
                 num_speculative_tokens: int = 0):
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.device = device
        self.free_indices: list[int] = list(range(max_num_reqs))
        self.req_id_to_index: dict[str, int] = {}
        self.index_to_req_id: dict[int, str] = {}
        self.pad_slot = max_num_reqs
        rows = max_num_reqs + 1

        # Prompt tokens (and, after preemption, earlier outputs) of every slot.
        # max_num_reqs x max_model_len int32 can be gigabytes: pinned host
        # memory read by the kernels through UVA where the device allows it,
        # except with speculative decoding, whose proposer scans it each step.
        self.num_speculative_tokens = num_speculative_tokens
        self.all_token_ids = StagedWriteTensor(
            (rows, max_model_len), torch.int32, device, uva=num_speculative_tokens == 0
        )
        self.prompt_len_np = np.zeros(rows, dtype=np.int32)
        self.prefill_len_np = np.zeros(rows, dtype=np.int32)
        self.prefill_len = StagedWriteTensor((rows,), torch.int32, device)
        # A pooling runner's token-level requests (one output row a prompt
        # token, ``runner.pooler``); host only, as the host picks the rows.
        self.pools_tokens_np = np.zeros(rows, dtype=bool)
        self.num_computed_tokens_np = np.zeros(rows, dtype=np.int32)
        self.num_computed_tokens = StagedWriteTensor((rows,), torch.int32, device)
        self.last_sampled_tokens = torch.zeros(rows, dtype=torch.int64, device=device)
        self.draft_tokens = torch.zeros(rows, max(num_speculative_tokens, 1), dtype=torch.int64,
                                        device=device)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, new: NewRequestData, prefill_ids: np.ndarray | None = None) -> int:
        """Give the request a slot and stage its tokens and lengths (the plan
        passed ``plan_check``: a new id, a free slot, prefill lengths that
        fit). ``prefill_ids``: its ``prefill_token_ids`` already converted
        (``check_plan`` returns them), else they are converted here."""
        prefill_len = len(new.prefill_token_ids)
        slot = self.free_indices.pop()
        self.req_id_to_index[new.req_id] = slot
        self.index_to_req_id[slot] = new.req_id
        self.prompt_len_np[slot] = len(new.prompt_token_ids)
        self.prefill_len_np[slot] = prefill_len
        self.prefill_len.stage_write_elem(slot, prefill_len)
        self.pools_tokens_np[slot] = new.pooling_task in TOKEN_POOLING_TASKS
        self.all_token_ids.stage_write(
            slot, 0, new.prefill_token_ids if prefill_ids is None else prefill_ids)
        self.set_num_computed_tokens(slot, new.num_computed_tokens)
        return slot

    def set_num_computed_tokens(self, slot: int, num_computed_tokens: int) -> None:
        self.num_computed_tokens_np[slot] = num_computed_tokens
        self.num_computed_tokens.stage_write_elem(slot, num_computed_tokens)

    def remove_request(self, req_id: str) -> int:
        """Free the request's slot; raises KeyError for an unknown id."""
        slot = self.req_id_to_index.pop(req_id)
        del self.index_to_req_id[slot]
        self.free_indices.append(slot)
        return slot

    @property
    def staged_tensors(self) -> tuple[StagedWriteTensor, ...]:
        """The tensors whose writes are staged on the host."""
        return (self.all_token_ids, self.prefill_len, self.num_computed_tokens)
