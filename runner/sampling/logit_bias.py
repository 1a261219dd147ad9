"""``allowed_token_ids`` and ``logit_bias`` (vLLM's): per-slot token lists
applied to the logits before the penalties.

A row whose slot has allowed ids keeps those tokens' logits and sets every
other to -inf; then each biased token's logit gets its bias added (a
biased token outside the allowed ids stays at -inf). The raw logprobs are
untouched, as vLLM's raw logprobs are.

State per slot, on the device: the allowed ids and the biased ids (int64
[max_num_reqs, width], -1 padded; an allowed row starting with -1 allows
every token) and the biases (float32, 0 where padded). The tables widen
when a request brings more entries than they hold (at most
``MAX_TOKEN_LIST``) and shrink, once requests leave, to what the remaining
users need (at least the initial width) when that is at most half their
width. Host mirrors: ``uses_np``, so a batch without such a slot costs
nothing, ``restricts_np``, so one with biases alone builds no [N, V] mask,
``num_users``, so a runner without any never looks, and ``widths_np``, the
entries each slot needs. A slot whose request leaves (``remove_request``)
has its rows cleared, as does one taken by a request without lists after
one with them: a batch's rows without lists always meet empty rows.
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.messages import SamplingOptions
from runner.ops import device_ops

_INITIAL_WIDTH = 8


class LogitBiasState:
    def __init__(self, max_num_reqs: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.device = device
        self.uses_np = np.zeros(max_num_reqs, dtype=bool)
        self.restricts_np = np.zeros(max_num_reqs, dtype=bool)  # has allowed ids
        self.num_users = 0
        self.widths_np = np.zeros(max_num_reqs, dtype=np.int64)
        self._left = False  # a user left since the last ``write_added_rows``
        self.allowed = self._ids_table(_INITIAL_WIDTH)
        self.bias_ids = self._ids_table(_INITIAL_WIDTH)
        self.bias_values = torch.zeros((max_num_reqs, _INITIAL_WIDTH), dtype=torch.float32,
                                       device=device)
        self.transfer = device_ops(device).new_transfer()
        self._pending: list[tuple[int, list[int], dict[int, float]]] = []

    def _ids_table(self, width: int) -> torch.Tensor:
        return torch.full((self.max_num_reqs, width), -1, dtype=torch.int64, device=self.device)

    def add_request(self, slot: int, options: SamplingOptions) -> None:
        """Note the slot's lists; their rows are written by ``write_added_rows``."""
        allowed = list(options.allowed_token_ids or ())
        bias = dict(options.logit_bias or {})
        uses = bool(allowed or bias)
        had = bool(self.uses_np[slot])
        self.num_users += uses - had
        self.uses_np[slot] = uses
        self.restricts_np[slot] = bool(allowed)
        self.widths_np[slot] = max(len(allowed), len(bias))
        if uses or had:
            self._pending.append((slot, allowed, bias))

    def remove_request(self, slot: int) -> None:
        """The slot's request left (finished or preempted): its rows are
        cleared, and the tables may shrink, by the next ``write_added_rows``."""
        if not self.uses_np[slot]:
            return
        self.add_request(slot, SamplingOptions())
        self._left = True

    def write_added_rows(self) -> None:
        """Write the rows of the slots added or removed since the last call
        (widening the tables where needed, shrinking them where users left)."""
        for slot, allowed, bias in self._pending:
            width = max(len(allowed), len(bias))
            if width > self.allowed.shape[1]:
                self._resize(width)
            width = self.allowed.shape[1]
            rows = np.full((2, width), -1, dtype=np.int64)
            rows[0, : len(allowed)] = allowed
            rows[1, : len(bias)] = list(bias)
            values = np.zeros(width, dtype=np.float32)
            values[: len(bias)] = list(bias.values())
            uploaded, uploaded_values = self.transfer.upload(rows, values)
            self.allowed[slot].copy_(uploaded[0])
            self.bias_ids[slot].copy_(uploaded[1])
            self.bias_values[slot].copy_(uploaded_values)
        self._pending = []
        if self._left:
            self._left = False
            width = max(_INITIAL_WIDTH, int(self.widths_np.max()))
            if 2 * width <= self.allowed.shape[1]:
                self._resize(width)

    def _resize(self, width: int) -> None:
        """New tables ``width`` entries wide, holding each row's first
        entries that fit (all of every user's, as callers guarantee)."""
        kept = min(width, self.allowed.shape[1])
        allowed, bias_ids = self._ids_table(width), self._ids_table(width)
        allowed[:, :kept], bias_ids[:, :kept] = self.allowed[:, :kept], self.bias_ids[:, :kept]
        values = torch.zeros((self.max_num_reqs, width), dtype=torch.float32, device=self.device)
        values[:, :kept] = self.bias_values[:, :kept]
        self.allowed, self.bias_ids, self.bias_values = allowed, bias_ids, values

    def any_active(self, idx_mapping_np: np.ndarray) -> bool:
        """Some slot of the batch has lists (host mirror only)."""
        return self.num_users > 0 and bool(np.any(self.uses_np[idx_mapping_np]))

    def apply(self, logits: torch.Tensor, idx_mapping: torch.Tensor,
              idx_mapping_np: np.ndarray) -> torch.Tensor:
        """``logits`` [N, V], any float dtype, as a new float32 tensor with
        each row's allowed ids and biases applied (rows of slots without
        lists unchanged); the [N, V] mask of allowed ids is built only where
        a row of the batch has them (host mirror)."""
        out = logits.to(torch.float32, copy=True)
        if bool(np.any(self.restricts_np[idx_mapping_np])):
            self._restrict(out, idx_mapping)
        ids = self.bias_ids[idx_mapping]
        values = torch.where(ids >= 0, self.bias_values[idx_mapping], 0.0)
        out.scatter_add_(1, ids.clamp(min=0), values)
        return out

    def _restrict(self, out: torch.Tensor, idx_mapping: torch.Tensor) -> None:
        """Every token but a row's allowed ids at -inf, in place (rows
        without allowed ids unchanged)."""
        allowed = self.allowed[idx_mapping]
        # scatter_add, not scatter: padding (-1 -> column 0) and a real id 0
        # may share a column; adding keeps the real one.
        kept = torch.zeros(out.shape, dtype=torch.int32, device=out.device)
        kept.scatter_add_(1, allowed.clamp(min=0), (allowed >= 0).to(torch.int32))
        restricted = (allowed[:, :1] >= 0) & (kept == 0)
        out.masked_fill_(restricted, float("-inf"))
