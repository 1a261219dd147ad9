"""``allowed_token_ids`` and ``logit_bias`` (vLLM's): per-slot token lists
applied to the logits before the penalties.

A row whose slot has allowed ids keeps those tokens' logits and sets every
other to -inf; then each biased token's logit gets its bias added (a
biased token outside the allowed ids stays at -inf). The raw logprobs are
untouched, as vLLM's raw logprobs are.

State per slot, on the device: the allowed ids and the biased ids (int64
[max_num_reqs, width], -1 padded; an allowed row starting with -1 allows
every token) and the biases (float32, 0 where padded), ``width`` sized to
the slots using lists (at most ``MAX_TOKEN_LIST``). On the host: which
slots use lists and how wide their rows are (``users``, a ``SlotUsers``;
its docstring holds the sizing rule), so a batch without such a slot costs
nothing, and ``restricts_np``, so one with biases alone builds no [N, V]
mask. A slot whose request leaves (``remove_request``) has its rows
cleared, as does one taken by a request without lists after one with
them: a batch's rows without lists always meet empty rows.
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.messages import SamplingOptions
from runner.ops import device_ops
from runner.sampling.slot_users import SlotUsers, with_width

_INITIAL_WIDTH = 8


class LogitBiasState:
    def __init__(self, max_num_reqs: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.device = device
        # Rows: (allowed ids, {biased id: bias}).
        self.users: SlotUsers[tuple[list[int], dict[int, float]]] = SlotUsers(
            max_num_reqs, (_INITIAL_WIDTH,))
        self.restricts_np = np.zeros(max_num_reqs, dtype=bool)  # has allowed ids
        self.allowed = self._ids_table(_INITIAL_WIDTH)
        self.bias_ids = self._ids_table(_INITIAL_WIDTH)
        self.bias_values = torch.zeros((max_num_reqs, _INITIAL_WIDTH), dtype=torch.float32,
                                       device=device)
        self.transfer = device_ops(device).new_transfer()

    def _ids_table(self, width: int) -> torch.Tensor:
        return torch.full((self.max_num_reqs, width), -1, dtype=torch.int64, device=self.device)

    def add_request(self, slot: int, options: SamplingOptions) -> None:
        """Note the slot's lists; their rows are written by ``write_added_rows``."""
        allowed = list(options.allowed_token_ids or ())
        bias = dict(options.logit_bias or {})
        self.restricts_np[slot] = bool(allowed)
        self.users.set(slot, (max(len(allowed), len(bias)),), (allowed, bias))

    def remove_request(self, slot: int) -> None:
        """The slot's request left (finished or preempted): its rows are
        cleared, and the tables may shrink, by the next ``write_added_rows``."""
        self.restricts_np[slot] = False
        self.users.clear(slot, ([], {}))

    def write_added_rows(self) -> None:
        """Write the rows of the slots added or removed since the last call
        (resizing the tables where needed)."""
        for slot, needs, (allowed, bias) in self.users.take_changes():
            if (size := self.users.grown(needs, self.allowed.shape[1:])) is not None:
                self._resize(*size)
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
        if (size := self.users.shrunk(self.allowed.shape[1:])) is not None:
            self._resize(*size)

    def _resize(self, width: int) -> None:
        """New tables ``width`` entries wide, holding each row's first
        entries that fit (all of every user's, as ``SlotUsers`` guarantees)."""
        self.allowed = with_width(self.allowed, width, -1)
        self.bias_ids = with_width(self.bias_ids, width, -1)
        self.bias_values = with_width(self.bias_values, width, 0.0)

    def any_active(self, idx_mapping_np: np.ndarray) -> bool:
        """Some slot of the batch has lists (host mirror only)."""
        return self.users.any_active(idx_mapping_np)

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
