"""Repetition, presence and frequency penalties (vLLM semantics), on the device.

For a row with repetition penalty r, presence penalty a and frequency
penalty f, and a token t that occurs c_t times among the request's output
tokens so far:

- if t occurs in the prompt or the output (c_t > 0), its logit l is
  divided by r when l > 0 and multiplied by r otherwise;
- then l -= f * c_t + a * [c_t > 0] (output tokens only).

State per slot, on the device: ``prompt_mask`` bool [max_num_reqs, vocab]
(token occurs in the prompt) and ``output_counts`` int32 [max_num_reqs,
vocab]. Memory: 5 bytes per (slot, token), e.g. 256 slots x 128,256 tokens
= 164 MB, 1024 x 151,936 = 778 MB; allocated once, so the KV-cache sizing
(which measures free memory after the runner is built) accounts for it.

The penalties read each row's parameters at its slot in the sampler's
per-slot table, so a batch needs no gather. Two implementations of one
signature (``runner.ops``): the torch references here (``apply_penalties_ref``,
about fifteen launches over [N, V] temporaries; ``record_sampled_ref``) and,
on CUDA, ``triton_penalties.py``'s kernels, which apply the penalties in one
launch and count the samples in another.

Invariants:
- The rows of a slot whose request uses a penalty are rebuilt on the device
  when the request is added: prompt presence from its prompt tokens, counts
  from the tokens it generated before a preemption (prefill tokens past the
  prompt). They are read from the runner's ``all_token_ids`` table, which
  already holds the prefill tokens, so nothing is copied from the host.
- After each step whose batch has a penalised row, every row whose sample
  is real (the ``sample_mask``) adds one to the count of its sampled token.
  Rows of slots without penalties may hold stale counts: their parameters
  (r = 1, a = f = 0) make those counts irrelevant.
"""

from __future__ import annotations

import torch

from runner.ops import device_ops


class PenaltyState:
    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.ops = device_ops(device)
        self.prompt_mask = torch.zeros(max_num_reqs, vocab_size, dtype=torch.bool, device=device)
        self.output_counts = torch.zeros(max_num_reqs, vocab_size, dtype=torch.int32, device=device)
        self._pending: list[tuple[int, int, int]] = []  # (slot, prompt_len, prefill_len)

    def add_request(self, slot: int, prompt_len: int, prefill_len: int) -> None:
        """Stage a rebuild of the slot's rows (for a request that uses a penalty)."""
        if not 0 <= prompt_len <= prefill_len:
            raise ValueError(f"prompt_len {prompt_len} outside [0, prefill_len {prefill_len}]")
        self._pending = [p for p in self._pending if p[0] != slot]
        self._pending.append((slot, prompt_len, prefill_len))

    def rebuild_added_rows(self, all_token_ids: torch.Tensor) -> None:
        """Rebuild the rows of the slots added since the last call from
        ``all_token_ids`` [slots, max_len] (on the device, already holding the
        prefill tokens); never waits."""
        for slot, prompt_len, prefill_len in self._pending:
            tokens = all_token_ids[slot, :prefill_len].to(torch.int64)
            self.prompt_mask[slot].zero_()
            self.prompt_mask[slot].index_fill_(0, tokens[:prompt_len], True)
            counts = self.output_counts[slot]
            counts.zero_()
            outputs = tokens[prompt_len:]
            counts.index_add_(0, outputs, torch.ones_like(outputs, dtype=counts.dtype))
        self._pending = []

    def apply(
        self,
        logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        slot_penalties: torch.Tensor,
        prior_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Penalised float32 logits [N, V] (a new tensor; ``logits`` of any
        float dtype) of the rows of slots ``idx_mapping`` (int64 [N]);
        ``slot_penalties`` [max_num_reqs, 3] holds each slot's repetition,
        presence and frequency penalties, read at each row's slot.
        ``prior_tokens`` [N, m] (-1: none) count as output tokens of their
        row on top of the slot's counts (drafts before a draft position)."""
        return self.ops.apply_penalties(logits, idx_mapping, slot_penalties, self.output_counts,
                                        self.prompt_mask, prior_tokens)

    def record_sampled(
        self, idx_mapping: torch.Tensor, sampled: torch.Tensor, sample_mask: torch.Tensor
    ) -> None:
        """Count each real sample (``sample_mask`` [N] bool) as an output token."""
        self.ops.record_sampled(self.output_counts, idx_mapping, sampled, sample_mask)


def apply_penalties_ref(
    logits: torch.Tensor,
    slots: torch.Tensor,
    slot_penalties: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    prior_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``PenaltyState.apply`` in torch: row i (slot ``slots[i]``) of
    ``logits`` penalised with its slot's row of ``slot_penalties``
    (repetition, presence, frequency) and of ``output_counts`` (plus its
    ``prior_tokens``) and ``prompt_mask``."""
    counts = output_counts[slots]
    if prior_tokens is not None:
        counts = counts + prior_counts(prior_tokens, output_counts.shape[1]).to(counts.dtype)
    in_output = counts > 0
    seen = prompt_mask[slots] | in_output
    logits = logits.to(torch.float32)
    params = slot_penalties[slots]
    scale = torch.where(seen, params[:, 0:1], 1.0)
    out = torch.where(logits > 0, logits / scale, logits * scale)
    out -= params[:, 2:3] * counts
    out -= params[:, 1:2] * in_output
    return out


def record_sampled_ref(output_counts: torch.Tensor, slots: torch.Tensor, sampled: torch.Tensor,
                       sample_mask: torch.Tensor) -> None:
    """Adds one to ``output_counts[slots[i], sampled[i]]`` for every row i
    whose ``sample_mask`` is set (rows of one slot may repeat a token)."""
    ones = sample_mask.to(output_counts.dtype)
    output_counts.index_put_((slots, sampled), ones, accumulate=True)


def prior_counts(prior_tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [N, V]: how often each token occurs in each row of
    ``prior_tokens`` [N, m] (entries < 0 are no token)."""
    rows = prior_tokens.shape[0]
    cols = torch.where(prior_tokens >= 0, prior_tokens, vocab_size).to(torch.int64)
    counts = torch.zeros(rows, vocab_size + 1, dtype=torch.int32, device=prior_tokens.device)
    counts.scatter_add_(1, cols, torch.ones_like(cols, dtype=torch.int32))
    return counts[:, :vocab_size]
