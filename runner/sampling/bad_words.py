"""``bad_words`` (vLLM's): token sequences a request must not complete.

The engine turns a request's bad words into token-id sequences
(``SamplingOptions.bad_words_token_ids``). Rule, for a row about to sample
and each sequence s of length L: when the request's last L - 1 output
tokens are s[:L-1] (always, for L == 1), the logit of s[-1] becomes -inf.
Prompt tokens never count: a sequence longer than the outputs so far plus
one cannot match. Applied before the penalties, as vLLM applies it before
them; the raw logprobs are untouched.

State per slot, on the device:
- ``words`` int32 [max_num_reqs, S, W]: the slot's sequences, one a row,
  right-aligned (the token to ban in the last column), -1 before them and
  in rows without one. S and W are sized to the slots using bad words
  (at most ``MAX_TOKEN_LIST`` sequences of ``MAX_BAD_WORD_TOKENS`` ids,
  ``SamplingOptions``' range).
- ``history`` int32 [max_num_reqs, W - 1]: the slot's last W - 1 output
  tokens, oldest first, -1 where the request has fewer. A -1 never equals
  a token id, so a sequence longer than the history so far never matches.

Invariants:
- A request that uses bad words has its rows written when it is added:
  its sequences, and its history rebuilt from the runner's
  ``all_token_ids`` table (its prefill tokens past the prompt are outputs
  from before a preemption), on the device, nothing read back.
- After each step whose batch has such a row, every row appends its real
  samples (``record_sampled``); rows of slots without bad words may hold
  stale histories, which their empty ``words`` rows make irrelevant.
- Which slots use bad words and what size their rows need is kept on the
  host (``users``, a ``SlotUsers``; its docstring holds the sizing rule),
  so a batch without such a slot costs nothing. A slot whose request
  leaves (``remove_request``) has its rows cleared, as does one taken by a
  request without bad words after one with them: a batch's rows without
  bad words always meet empty ``words`` rows.
- Resizing adds or drops columns on the left: every sequence stays
  right-aligned and every history keeps its most recent tokens, which are
  all its own sequences can read.
"""

from __future__ import annotations

import numpy as np
import torch

from runner.ops import device_ops
from runner.sampling.slot_users import SlotUsers

_INITIAL_SEQUENCES = 4
_INITIAL_WIDTH = 4


class BadWordsState:
    def __init__(self, max_num_reqs: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.device = device
        # Rows: (sequences, prompt_len, prefill_len).
        self.users: SlotUsers[tuple[list[list[int]], int, int]] = SlotUsers(
            max_num_reqs, (_INITIAL_SEQUENCES, _INITIAL_WIDTH))
        self.words = torch.full((max_num_reqs, _INITIAL_SEQUENCES, _INITIAL_WIDTH), -1,
                                dtype=torch.int32, device=device)
        self.history = torch.full((max_num_reqs, _INITIAL_WIDTH - 1), -1, dtype=torch.int32,
                                  device=device)
        self.transfer = device_ops(device).new_transfer()

    def add_request(self, slot: int, sequences: list[list[int]], prompt_len: int,
                    prefill_len: int) -> None:
        """Note the slot's sequences (none: the slot has no bad words); its
        rows are written by ``write_added_rows``. Tokens
        ``prompt_len .. prefill_len - 1`` of its prefill are earlier outputs."""
        if not 0 <= prompt_len <= prefill_len:
            raise ValueError(f"prompt_len {prompt_len} outside [0, prefill_len {prefill_len}]")
        needs = (len(sequences), max(map(len, sequences), default=0))
        self.users.set(slot, needs, ([list(s) for s in sequences], prompt_len, prefill_len))

    def remove_request(self, slot: int) -> None:
        """The slot's request left (finished or preempted): its rows are
        cleared, and the tables may shrink, by the next ``write_added_rows``."""
        self.users.clear(slot, ([], 0, 0))

    def write_added_rows(self, all_token_ids: torch.Tensor) -> None:
        """Write the rows of the slots added or removed since the last call
        (resizing the tables where needed); histories are read from
        ``all_token_ids`` [slots, max_len] (on the device, already holding
        the prefill tokens). Never waits."""
        for slot, needs, (sequences, prompt_len, prefill_len) in self.users.take_changes():
            if (size := self.users.grown(needs, self.words.shape[1:])) is not None:
                self._resize(*size)
            rows = np.full(self.words.shape[1:], -1, dtype=np.int32)
            for i, s in enumerate(sequences):
                rows[i, rows.shape[1] - len(s):] = s
            (uploaded,) = self.transfer.upload(rows)
            self.words[slot].copy_(uploaded)
            history = self.history[slot]
            history.fill_(-1)
            kept = min(history.shape[0], prefill_len - prompt_len) if sequences else 0
            if kept > 0:
                history[-kept:] = all_token_ids[slot, prefill_len - kept:prefill_len]
        if (size := self.users.shrunk(self.words.shape[1:])) is not None:
            self._resize(*size)

    def _resize(self, count: int, width: int) -> None:
        """New tables of ``count`` sequences of ``width`` ids, holding the
        first sequences of each row and the last columns of each sequence and
        history that fit (all of every user's, as ``SlotUsers`` guarantees)."""
        old_count, old_width = self.words.shape[1:]
        kept_count, kept_width = min(count, old_count), min(width, old_width)
        words = torch.full((self.max_num_reqs, count, width), -1, dtype=torch.int32,
                           device=self.device)
        words[:, :kept_count, width - kept_width:] = \
            self.words[:, :kept_count, old_width - kept_width:]
        history = torch.full((self.max_num_reqs, width - 1), -1, dtype=torch.int32,
                             device=self.device)
        history[:, width - kept_width:] = self.history[:, old_width - kept_width:]
        self.words, self.history = words, history

    def any_active(self, idx_mapping_np: np.ndarray) -> bool:
        """Some slot of the batch has bad words (host mirror only)."""
        return self.users.any_active(idx_mapping_np)

    def apply(self, logits: torch.Tensor, idx_mapping: torch.Tensor,
              prior_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """``logits`` [N, V], any float dtype, as a new float32 tensor with
        each row's banned tokens at -inf (rows of slots without bad words
        unchanged); ``idx_mapping`` int64 [N] the rows' slots.
        ``prior_tokens`` [N, m] (-1: none; the valid entries lead each row,
        nearest first) are output tokens between the slot's history and the
        row's position (the drafts before a draft position)."""
        out = logits.to(torch.float32, copy=True)
        words = self.words[idx_mapping]  # [N, S, W]
        recent = self._recent(idx_mapping, prior_tokens)  # [N, W - 1]
        prefix = words[:, :, :-1]
        matches = ((prefix < 0) | (prefix == recent[:, None, :])).all(dim=2)
        banned = words[:, :, -1]
        matches &= banned >= 0
        # amin with +inf leaves a logit as it is, with -inf bans it: the
        # result does not depend on the order of writes to one token (two
        # sequences may end in it) or on padding (-1, sent to column 0).
        fill = torch.where(matches, float("-inf"), float("inf"))
        out.scatter_reduce_(1, banned.clamp(min=0).to(torch.int64), fill, reduce="amin")
        return out

    def _recent(self, idx_mapping: torch.Tensor,
                prior_tokens: torch.Tensor | None) -> torch.Tensor:
        """int32 [N, W - 1]: the last W - 1 output tokens before each row's
        position, oldest first (-1 where there are fewer): the slot's
        history followed by the row's prior tokens."""
        history = self.history[idx_mapping]
        if prior_tokens is None or prior_tokens.shape[1] == 0 or history.shape[1] == 0:
            return history
        num_prior = prior_tokens.shape[1]
        known = (prior_tokens >= 0).sum(dim=1, keepdim=True)  # [N, 1]
        # Column j of ``back`` is a token j + 1 places before the position
        # when j < known, else column (m + j - known): the history, newest
        # first, comes after the m prior columns.
        back = torch.cat([prior_tokens.to(torch.int32), history.flip(1)], dim=1)
        j = torch.arange(history.shape[1], device=history.device)[None, :]
        col = torch.where(j < known, j, num_prior + j - known)
        return back.gather(1, col).flip(1)

    def record_sampled(self, idx_mapping: torch.Tensor, tokens: torch.Tensor,
                       counts: torch.Tensor) -> None:
        """Append ``tokens[i, :counts[i]]`` ([N, T], any int dtype; ``counts``
        [N], 0 for a row whose sample is not real) to the history of slot
        ``idx_mapping[i]`` (int64 [N], each slot at most once)."""
        history = self.history[idx_mapping]
        width = history.shape[1]
        if width == 0:
            return
        joined = torch.cat([history, tokens.to(torch.int32)], dim=1)
        col = counts.to(torch.int64)[:, None] + torch.arange(width, device=history.device)
        self.history.index_copy_(0, idx_mapping, joined.gather(1, col))
