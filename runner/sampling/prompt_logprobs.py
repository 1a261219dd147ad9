"""Prompt logprobs (vLLM's ``prompt_logprobs``): for each prompt token after
the first, its logprob under the model given the tokens before it, its rank,
and the ``k`` most likely tokens at that position.

Computed chunk by chunk, from the hidden states of the step's forward pass:
a prefill chunk covering positions ``[c, c + n)`` of a request whose prompt
has ``L`` tokens scores positions ``p in [c, min(c + n, L - 1))`` against
the prompt token at ``p + 1`` (read from the runner's device table of
prefill tokens, so a target in the next chunk is known). Only those rows
pass through the LM head, in blocks of at most ``ROWS_PER_BLOCK``, so
neither a long prompt nor a full token budget ever holds
``[prompt_len, vocab]`` logits at once; the step's results are as wide as
its widest ``k``, and the scheduler holds their rows times that width to
``engine.prompt_logprobs.ENTRIES_PER_STEP``, so no step's results grow
with the prompt either. Under tensor parallelism the LM
head gathers the vocabulary shards, so every rank computes the same
numbers (and every rank must run the head: it is a collective).

Invariants: a request that asks for none costs nothing (the host mirror
``num_top_np`` is -1 for its slot); the decode graphs never see a step that
scores prompt tokens (``needs_eager``); the values come from the raw logits,
as the sampled tokens' logprobs do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ipc.messages import WHOLE_VOCAB, Logprobs, PromptLogprobs
from runner.ops import device_ops
from runner.sampling.logprobs import LogprobsTensors

NONE = -1
ALL_TOKENS = np.iinfo(np.int64).max  # a request's ``WHOLE_VOCAB``
ROWS_PER_BLOCK = 512


@dataclass(frozen=True)
class PromptChunks:
    """Host side of one step's prompt scoring, in batch order: request
    ``req_ids[j]`` scores ``counts[j]`` prompt tokens from prompt index
    ``starts[j]`` on and wants ``num_top[j]`` top entries."""

    req_ids: list[str]
    starts: list[int]
    counts: list[int]
    num_top: list[int]


@dataclass(frozen=True)
class PromptLogprobsOutput:
    """One step's prompt logprobs on the device, rows in ``chunks`` order."""

    chunks: PromptChunks
    tensors: LogprobsTensors

    def to_message(self, host: tuple[torch.Tensor, ...]) -> PromptLogprobs:
        """The reply's field, from the host copies of ``tensors.tensors()``."""
        top_ids, top_lps, lps, ranks = (t.tolist() for t in host)
        tops = [k for count, k in zip(self.chunks.counts, self.chunks.num_top)
                for _ in range(count)]
        return PromptLogprobs(
            req_ids=self.chunks.req_ids, starts=self.chunks.starts, counts=self.chunks.counts,
            logprobs=Logprobs(
                top_token_ids=[row[:k] for row, k in zip(top_ids, tops)],
                top_logprobs=[row[:k] for row, k in zip(top_lps, tops)],
                sampled_logprobs=lps, sampled_ranks=ranks))


class PromptLogprobsState:
    def __init__(self, max_num_reqs: int, device: torch.device):
        self.num_top_np = np.full(max_num_reqs, NONE, dtype=np.int64)
        # Slots whose num_top_np is set, freed ones included (a slot keeps
        # its value until reused): 0 means no request asks, and no step looks.
        self.num_asking = 0
        ops = device_ops(device)
        self.transfer = ops.new_transfer()
        self.compute_logprobs = ops.compute_logprobs

    def add_request(self, slot: int, num_top: int | None) -> None:
        """``num_top``: the request's ``prompt_logprobs`` (None: none;
        ``WHOLE_VOCAB``: every token, stored as int64's largest, which
        ``compute`` clamps to the vocabulary like any count past it)."""
        value = (NONE if num_top is None
                 else ALL_TOKENS if num_top == WHOLE_VOCAB else num_top)
        if value == NONE and self.num_asking == 0:
            return  # the slot's value is NONE already
        self.num_asking += (value != NONE) - bool(self.num_top_np[slot] != NONE)
        self.num_top_np[slot] = value

    def _chunks(self, req_ids: list[str], slots: np.ndarray, computed: np.ndarray,
                scheduled: np.ndarray, prompt_len: np.ndarray) -> tuple[PromptChunks, list]:
        """Which prompt positions each batch row scores: (chunks, per-row
        (batch row, first position, count) of the rows that score any)."""
        chunks = PromptChunks([], [], [], [])
        rows = []
        for i, slot in enumerate(slots):
            k = int(self.num_top_np[slot])
            first, end = int(computed[i]), min(int(computed[i] + scheduled[i]),
                                               int(prompt_len[slot]) - 1)
            if k == NONE or end <= first:
                continue
            chunks.req_ids.append(req_ids[i])
            chunks.starts.append(first + 1)
            chunks.counts.append(end - first)
            chunks.num_top.append(k)
            rows.append((i, first, end - first))
        return chunks, rows

    def needs_eager(self, req_ids: list[str], req_id_to_index: dict[str, int],
                    computed: np.ndarray, prompt_len: np.ndarray) -> bool:
        """Some request of the plan scores prompt tokens this step. Runs on
        every step: without a slot that asked, no id is looked at."""
        if self.num_asking == 0:
            return False
        for req_id in req_ids:
            slot = req_id_to_index[req_id]
            if self.num_top_np[slot] != NONE and computed[slot] < prompt_len[slot] - 1:
                return True
        return False

    def compute(self, hidden: torch.Tensor, req_ids: list[str], slots: np.ndarray,
                query_start_loc: np.ndarray, computed: np.ndarray, scheduled: np.ndarray,
                prompt_len: np.ndarray, all_token_ids: torch.Tensor,
                compute_logits: Callable[[torch.Tensor], torch.Tensor],
                vocab_size: int) -> PromptLogprobsOutput | None:
        """Score the step's prompt positions (None when no row asks).

        ``hidden`` [tokens, hidden]: the forward pass's output, token t of
        batch row i at ``query_start_loc[i] + t``; ``computed``/``scheduled``
        per batch row; ``prompt_len`` per slot (host); ``all_token_ids``
        [slots, max_len] the device table of prefill tokens.
        """
        if self.num_asking == 0:
            return None
        chunks, rows = self._chunks(req_ids, slots, computed, scheduled, prompt_len)
        if not rows:
            return None
        token_rows = np.concatenate([query_start_loc[i] + np.arange(n) for i, _, n in rows])
        target_slots = np.concatenate([np.full(n, slots[i]) for i, _, n in rows])
        target_pos = np.concatenate([first + 1 + np.arange(n) for _, first, n in rows])
        dev_rows, dev_slots, dev_pos = self.transfer.upload(
            token_rows.astype(np.int64), target_slots.astype(np.int64),
            target_pos.astype(np.int64))
        targets = all_token_ids[dev_slots, dev_pos].to(torch.int64)
        num_top = min(max(chunks.num_top), vocab_size)
        parts = []
        for start in range(0, len(token_rows), ROWS_PER_BLOCK):
            block = slice(start, start + ROWS_PER_BLOCK)
            # In the model's dtype: the reference casts to float32 itself.
            logits = compute_logits(hidden[dev_rows[block]], None)
            parts.append(self.compute_logprobs(logits, targets[block], num_top))
        tensors = LogprobsTensors(*(torch.cat(ts) for ts in zip(*(p.tensors() for p in parts))))
        return PromptLogprobsOutput(chunks, tensors)
