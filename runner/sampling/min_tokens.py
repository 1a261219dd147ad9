"""``min_tokens`` (vLLM semantics): a request's stop tokens cannot be sampled
before it has generated ``min_tokens`` tokens.

The engine puts the ids to hold back in ``NewRequestData.min_tokens_stop_ids``
(its ``stop_token_ids``, plus the model's end-of-sequence ids unless
``ignore_eos``). For a row about to sample output token ``k`` (0-based;
``k = position - prompt_len``) of a slot whose ``k < min_tokens``, those
ids' logits become -inf before sampling; the raw logprobs are untouched.

State per slot, on the device: ``min_tokens`` and ``prompt_len`` (int64
[max_num_reqs]; both 0 for a slot without a rule, which is then never
active, so a request without a rule added to such a slot writes nothing)
and the stop ids (int64 [max_num_reqs, width], -1 padded); the table widens
when a request brings more ids than it holds. Host mirror:
``min_tokens_np``, so a batch with no such slot costs nothing, and
``num_rules``, the slots of ``min_tokens_np`` above 0 (a freed slot keeps
its rule until reused), so a runner without any rule never looks.
"""

from __future__ import annotations

import numpy as np
import torch

from runner.ops import device_ops
from runner.staged_write import StagedWriteTensor

_INITIAL_WIDTH = 8


class MinTokensState:
    def __init__(self, max_num_reqs: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.device = device
        self.min_tokens_np = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_rules = 0
        self.limits = StagedWriteTensor((max_num_reqs, 2), torch.int64, device)
        self.stop_ids = torch.full((max_num_reqs, _INITIAL_WIDTH), -1, dtype=torch.int64,
                                   device=device)
        self.transfer = device_ops(device).new_transfer()
        self._pending: list[tuple[int, list[int]]] = []

    def add_request(self, slot: int, min_tokens: int, prompt_len: int,
                    stop_ids: list[int]) -> None:
        """Stage the slot's rule (a slot with ``min_tokens == 0`` has none)."""
        rule = min_tokens if stop_ids else 0
        had_rule = bool(self.min_tokens_np[slot] > 0)
        self.num_rules += (rule > 0) - had_rule
        self.min_tokens_np[slot] = rule
        if rule:
            self.limits.stage_write(slot, 0, [rule, prompt_len])
            self._pending.append((slot, list(stop_ids)))
        elif had_rule:  # a slot without a rule keeps limits (0, 0): never active
            self.limits.stage_write(slot, 0, [0, 0])

    @property
    def staged_tensors(self) -> tuple[StagedWriteTensor, ...]:
        """The tensors whose writes are staged on the host."""
        return (self.limits,)

    def write_added_stop_ids(self) -> None:
        """Write the stop ids of the rules added since the last call into
        their slots' rows (widening the table where needed); the limits are
        staged writes, applied apart (``staged_tensors``)."""
        for slot, ids in self._pending:
            if len(ids) > self.stop_ids.shape[1]:
                self._widen(len(ids))
            row = np.full(self.stop_ids.shape[1], -1, dtype=np.int64)
            row[: len(ids)] = ids
            (uploaded,) = self.transfer.upload(row)
            self.stop_ids[slot].copy_(uploaded)
        self._pending = []

    def _widen(self, width: int) -> None:
        wider = torch.full((self.max_num_reqs, width), -1, dtype=torch.int64, device=self.device)
        wider[:, : self.stop_ids.shape[1]] = self.stop_ids
        self.stop_ids = wider

    def any_active(self, idx_mapping_np: np.ndarray) -> bool:
        """Some slot of the batch has a min_tokens rule (host mirror only)."""
        if self.num_rules == 0:
            return False
        return bool(np.any(self.min_tokens_np[idx_mapping_np] > 0))

    def apply(self, logits: torch.Tensor, idx_mapping: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
        """``logits`` [N, V], any float dtype (a new tensor of it is returned), with each
        active row's stop ids at -inf; ``positions`` [N]: the position of the
        token each row samples."""
        limits = self.limits.gpu[idx_mapping]
        active = positions.to(torch.int64) - limits[:, 1] < limits[:, 0]
        ids = self.stop_ids[idx_mapping]
        hit = ((ids >= 0) & active[:, None]).to(torch.int32)
        # scatter_add, not scatter: padding (-1 -> column 0) and a real stop
        # id 0 may share a column; adding keeps the real one.
        mask = torch.zeros(logits.shape, dtype=torch.int32, device=logits.device)
        mask.scatter_add_(1, ids.clamp(min=0), hit)
        return logits.masked_fill(mask > 0, float("-inf"))
