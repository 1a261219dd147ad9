"""``min_tokens`` (vLLM semantics): a request's stop tokens cannot be sampled
before it has generated ``min_tokens`` tokens.

The engine puts the ids to hold back in ``NewRequestData.min_tokens_stop_ids``
(its ``stop_token_ids``, plus every end-of-sequence id of the model and
its tokenizer, with ``ignore_eos`` too, as vLLM). For a row about to sample output token ``k`` (0-based;
``k = position - prompt_len``) of a slot whose ``k < min_tokens``, those
ids' logits become -inf before sampling; the raw logprobs are untouched.

State per slot, on the device: ``min_tokens`` and ``prompt_len`` (int64
[max_num_reqs]; both 0 for a slot without a rule, which is then never
active) and the stop ids (int64 [max_num_reqs, width], -1 padded, ``width``
sized to the slots with rules). On the host: which slots have a rule and
how many ids it holds (``users``, a ``SlotUsers``; its docstring holds the
sizing rule), so a runner or a batch without rules never looks. A slot
whose request leaves (``remove_request``) loses its rule, as does one
taken by a request without a rule.
"""

from __future__ import annotations

import numpy as np
import torch

from runner.ops import device_ops
from runner.sampling.slot_users import SlotUsers, with_width
from runner.staged_write import StagedWriteTensor

_INITIAL_WIDTH = 8


class MinTokensState:
    def __init__(self, max_num_reqs: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.device = device
        self.users: SlotUsers[list[int]] = SlotUsers(max_num_reqs, (_INITIAL_WIDTH,))
        self.limits = StagedWriteTensor((max_num_reqs, 2), torch.int64, device)
        self.stop_ids = torch.full((max_num_reqs, _INITIAL_WIDTH), -1, dtype=torch.int64,
                                   device=device)
        self.transfer = device_ops(device).new_transfer()

    def add_request(self, slot: int, min_tokens: int, prompt_len: int,
                    stop_ids: list[int]) -> None:
        """Stage the slot's rule (a slot with ``min_tokens == 0`` or no stop
        ids has none)."""
        rule = min_tokens if stop_ids else 0
        if rule:
            self.limits.stage_write(slot, 0, [rule, prompt_len])
        elif self.users.uses_np[slot]:  # limits (0, 0): never active
            self.limits.stage_write(slot, 0, [0, 0])
        self.users.set(slot, (len(stop_ids) if rule else 0,), list(stop_ids) if rule else [])

    def remove_request(self, slot: int) -> None:
        """The slot's request left (finished or preempted): its rule is gone,
        and the table may shrink, by the next ``write_added_stop_ids``."""
        if self.users.uses_np[slot]:
            self.limits.stage_write(slot, 0, [0, 0])
        self.users.clear(slot, [])

    @property
    def staged_tensors(self) -> tuple[StagedWriteTensor, ...]:
        """The tensors whose writes are staged on the host."""
        return (self.limits,)

    def write_added_stop_ids(self) -> None:
        """Write the stop ids of the slots added or removed since the last
        call into their rows (resizing the table where needed); the limits
        are staged writes, applied apart (``staged_tensors``)."""
        for slot, needs, ids in self.users.take_changes():
            if (size := self.users.grown(needs, self.stop_ids.shape[1:])) is not None:
                self._resize(*size)
            row = np.full(self.stop_ids.shape[1], -1, dtype=np.int64)
            row[: len(ids)] = ids
            (uploaded,) = self.transfer.upload(row)
            self.stop_ids[slot].copy_(uploaded)
        if (size := self.users.shrunk(self.stop_ids.shape[1:])) is not None:
            self._resize(*size)

    def _resize(self, width: int) -> None:
        """A new table ``width`` ids wide, holding each row's first ids that
        fit (all of every rule's, as ``SlotUsers`` guarantees)."""
        self.stop_ids = with_width(self.stop_ids, width, -1)

    def any_active(self, idx_mapping_np: np.ndarray) -> bool:
        """Some slot of the batch has a min_tokens rule (host mirror only)."""
        return self.users.any_active(idx_mapping_np)

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
