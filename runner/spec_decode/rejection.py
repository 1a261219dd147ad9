"""The rejection sampler: verifies a step's drafts on the device, lossless.

Layout. Batch row i owns logits rows ``cu_num_logits[i] .. cu_num_logits[i+1]-1``
(m_i of them): a row with d drafts has m = 1 + d, one logits row per
position it verifies plus the bonus position; any other row has one. Logits
row l at offset j < m_i - 1 carries draft ``drafts[l]`` (the input token
after it); the last offset carries none.

Rule. At every logits row the target distribution p is the one a plain
one-token step would sample from at that position: penalties (counting the
row's earlier drafts as outputs), bad words (the same), temperature, min-p, top-k, top-p, seed,
all by ``Sampler.draw``. Then, per batch row, drafts are accepted from the
left while they pass; at the first that fails, or at the bonus position
when all pass, one more token is emitted. Row i emits ``num_accepted[i] +
1`` tokens: ``tokens[i, :num_accepted[i] + 1]``.

- Drafts that are a point mass q = delta(d) (the n-gram proposer): draw
  x ~ p at every logits row with the plain sampler's noise; accept iff
  x == d, and emit x. P(accept) = p(d) = min(1, p(d)/q(d)), and a rejected
  x is distributed as p given x != d, which is norm(max(0, p - q)): this
  is the standard rule, so the output is distributed exactly as p. Greedy
  rows are the temperature-0 case: accept while the draft is the argmax.
  A seeded request draws the same x with or without drafts (same seed,
  same position), so its output is the same token for token.
- Drafts from a distribution q (a draft model): accept iff
  u * q(d) < p(d) with u uniform, a stateless hash of (seed, position);
  on rejection emit a draw from norm(max(0, p - q)); the bonus is a draw
  from p (``accept_with_probs``).

A row whose token is forced (a spent thinking budget, ``forced``, or one
its drafts spend, ``budgets``: ``runner.spec_decode.drafted_budgets``)
has p the point mass at the forced token, on the sampler's copy of the
logits: its draft passes iff it is that token, and the token emitted
there is that token; logprobs stay the model's.

Every random number is a stateless hash of (seed, position, token), so
every tensor-parallel rank takes the same decisions. No host sync: shapes
depend only on host-known counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runner.sampler import Sampler, SamplerOutput, TargetDraw
from runner.sampling.forced_tokens import ForcedTokens
from runner.sampling.noise import token_keys, uniform_noise
from runner.spec_decode.drafted_budgets import DraftedBudgets


@dataclass(frozen=True)
class DraftLayout:
    """Where a step's logits rows sit; device tensors, fixed shapes.

    ``row_of`` [L] batch row of each logits row; ``offset`` [L] its offset
    in the row; ``has_draft`` [L] bool; ``matrix`` [N, W] the logits row of
    (row i, offset j), clamped, and ``valid`` [N, W] whether it exists
    (W = 1 + k)."""

    row_of: torch.Tensor
    offset: torch.Tensor
    has_draft: torch.Tensor
    matrix: torch.Tensor
    valid: torch.Tensor

    @staticmethod
    def build(cu_num_logits: torch.Tensor, num_reqs: int, num_logits: int,
              width: int) -> DraftLayout:
        device = cu_num_logits.device
        cu = cu_num_logits[: num_reqs + 1].to(torch.int64)
        rows = torch.arange(num_logits, device=device)
        row_of = torch.searchsorted(cu[1:], rows, right=True).clamp(max=max(num_reqs - 1, 0))
        offset = rows - cu[row_of]
        has_draft = rows + 1 < cu[row_of + 1]
        j = torch.arange(width, device=device)[None, :]
        matrix = cu[:-1, None] + j
        valid = matrix < cu[1:, None]
        return DraftLayout(row_of, offset, has_draft, matrix.clamp(max=max(num_logits - 1, 0)),
                           valid)

    def prior_drafts(self, drafts: torch.Tensor, width: int) -> torch.Tensor:
        """[L, width - 1]: the drafts of the same batch row before each
        logits row (-1 where there is none)."""
        m = torch.arange(1, width, device=drafts.device)[None, :]
        src = torch.arange(drafts.shape[0], device=drafts.device)[:, None] - m
        ok = m <= self.offset[:, None]
        return torch.where(ok, drafts[src.clamp(min=0)], -1)

    def accepted(self, accept: torch.Tensor) -> torch.Tensor:
        """int64 [N]: leading accepted drafts of each batch row."""
        ok = accept[self.matrix] & self.valid
        return ok.to(torch.int64).cumprod(dim=1).sum(dim=1)


def accept_point_mass(targets: torch.Tensor, drafts: torch.Tensor,
                      has_draft: torch.Tensor) -> torch.Tensor:
    """bool [L]: drafts from a point mass pass iff the target's draw equals them."""
    return has_draft & (targets == drafts)


def accept_with_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                      drafts: torch.Tensor, has_draft: torch.Tensor, seeds: torch.Tensor,
                      positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [L], accept [L]) for drafts drawn from ``draft_probs`` q.

    Accept iff u * q(d) < p(d), u = a uniform hashed from (seed, position)
    apart from every token's noise; the token at a logits row is the draft
    if accepted, else a Gumbel-max draw from max(0, p - q) (from p itself
    where that is all zero, or at the bonus position). Probabilities
    [L, V] float32, rows summing to 1."""
    vocab = target_probs.shape[1]
    d = drafts.clamp(0, vocab - 1)[:, None]
    p_d = target_probs.gather(1, d)[:, 0]
    q_d = draft_probs.gather(1, d)[:, 0]
    # The acceptance uniform hashes the key of token id ``vocab``, which no
    # token has: it is independent of every token's noise.
    u = uniform_noise(seeds, positions, token_keys(vocab + 1, target_probs.device)[vocab:])[:, 0]
    accept = has_draft & (u * q_d < p_d)
    residual = (target_probs - draft_probs).clamp(min=0)
    empty = residual.sum(dim=1, keepdim=True) <= 0
    residual = torch.where(empty | ~has_draft[:, None], target_probs, residual)
    noise = uniform_noise(seeds, positions, token_keys(vocab, target_probs.device))
    noise.log_().neg_().log_().neg_()
    recovered = (residual.log() + noise).argmax(dim=1)
    return torch.where(accept, drafts, recovered), accept


@dataclass(frozen=True)
class SpecSamplerOutput:
    """A step's verified tokens: ``tokens`` [N, W], ``num_accepted`` [N]
    (row i emits ``tokens[i, :num_accepted[i] + 1]``), ``last`` [N] the
    last emitted token, ``targets`` [L] the token at every logits row
    (= the emitted ones where they were emitted), and the logprobs of
    ``targets`` per logits row (None when no row asked)."""

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    last: torch.Tensor
    targets: torch.Tensor
    sampler_output: SamplerOutput


class RejectionSampler:
    """Verifies drafts through the runner's ``Sampler`` (one state, one rule)."""

    def __init__(self, sampler: Sampler, num_speculative_tokens: int):
        self.sampler = sampler
        self.width = 1 + num_speculative_tokens

    def __call__(self, logits: torch.Tensor, drafts: torch.Tensor, layout: DraftLayout,
                 idx_mapping: torch.Tensor, idx_mapping_np: np.ndarray,
                 num_logits_np: np.ndarray, positions: torch.Tensor,
                 sample_mask: torch.Tensor,
                 forced: ForcedTokens | None = None,
                 budgets: DraftedBudgets | None = None) -> SpecSamplerOutput:
        """``logits`` [L, V]; ``drafts`` [L] (meaningful where
        ``layout.has_draft``); ``idx_mapping`` [N] slots; ``num_logits_np``
        [N] host counts; ``positions`` [L] the position each logits row
        samples; ``sample_mask`` [N]: rows whose tokens are real;
        ``forced``: logits rows whose token is decided (``Sampler.draw``);
        ``budgets``: drafted rows whose thinking budget may force them,
        decided here from the drafts before each (a forced row's draft
        passes only if it is the forced token, which the row emits)."""
        slots = idx_mapping.to(torch.int64)[layout.row_of]
        slots_np = np.repeat(idx_mapping_np, num_logits_np)
        prior = layout.prior_drafts(drafts, self.width) if self.width > 1 else None
        if budgets is not None:
            by_drafts = budgets.forced_tokens(prior)
            forced = by_drafts if forced is None else forced.merged(by_drafts)
        draw = self.sampler.draw(logits, slots, slots_np, positions, prior, forced=forced)
        accept = accept_point_mass(draw.sampled, drafts, layout.has_draft)
        num_accepted = layout.accepted(accept)
        tokens = draw.sampled[layout.matrix]
        last = tokens.gather(1, num_accepted[:, None])[:, 0]
        if draw.flags.any_penalty:
            self._record(draw, layout, num_accepted, sample_mask)
        if draw.any_bad_words:
            emitted = (num_accepted + 1) * sample_mask
            self.sampler.bad_words.record_sampled(idx_mapping.to(torch.int64), tokens, emitted)
        num_logprobs = self.sampler.states.num_logprobs_np[idx_mapping_np]
        out = SamplerOutput(draw.sampled, self.sampler.logprobs(draw), num_logprobs)
        return SpecSamplerOutput(tokens, num_accepted, last, draw.sampled, out)

    def _record(self, draw: TargetDraw, layout: DraftLayout, num_accepted: torch.Tensor,
                sample_mask: torch.Tensor) -> None:
        """Count every emitted token as an output token (penalties)."""
        emitted = (layout.offset <= num_accepted[layout.row_of]) & sample_mask[layout.row_of]
        self.sampler.penalties.record_sampled(draw.idx, draw.sampled, emitted)
