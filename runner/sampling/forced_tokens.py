"""Tokens a step must sample, whatever the requests' own token limits say.

A request's thinking budget, once spent, forces the end of its reasoning
(``GrammarBitmask.forced_token_ids``). Its grammar-mask row allows every
token, so the logits the sampler receives are the model's and the forced
token's logprob is the model's own (vLLM's default "raw_logprobs" reads
the logits before any processor; its budget is one, run after them).
``ForcedTokens.apply``, called by ``Sampler.draw`` after the request's own
masks and penalties (``allowed_token_ids`` without the token, a bad word
ending in it, ``min_tokens`` holding it back as a stop id: the forced
token wins over them all, as vLLM's budget, last among its logits
processors, does), leaves the row the forced token alone, at logit 0, on
the logits the sampler draws from, never on the raw ones it reads
logprobs from.

With drafts, whether a row is forced depends on the drafted tokens before
it, which only the device knows (``runner.spec_decode.drafted_budgets``):
such rows come with ``forced``, a device mask that says which of them the
token is forced at; the others keep their logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ForcedTokens:
    """``rows`` int64 [k]: logits rows (distinct); ``token_ids`` int64 [k]:
    the token each row must sample; ``forced`` bool [k] or None (every
    row): which rows are forced. All on the logits' device."""

    rows: torch.Tensor
    token_ids: torch.Tensor
    forced: torch.Tensor | None = None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (those the sampler draws from: its own copy, or the
        model's where nothing reads them after) with each forced row -inf
        but at its token, in place; no host sync."""
        if self.forced is None:
            logits.index_fill_(0, self.rows, float("-inf"))
            logits.index_put_((self.rows, self.token_ids),
                              torch.zeros((), dtype=logits.dtype, device=logits.device))
            return logits
        picked = logits.index_select(0, self.rows)
        only = torch.full_like(picked, float("-inf"))
        only.scatter_(1, self.token_ids[:, None], 0.0)
        logits.index_copy_(0, self.rows, torch.where(self.forced[:, None], only, picked))
        return logits

    def merged(self, other: ForcedTokens | None) -> ForcedTokens:
        """These rows and ``other``'s (rows distinct between the two)."""
        if other is None:
            return self

        def mask(f: ForcedTokens) -> torch.Tensor:
            return (torch.ones_like(f.rows, dtype=torch.bool) if f.forced is None
                    else f.forced)

        return ForcedTokens(torch.cat([self.rows, other.rows]),
                            torch.cat([self.token_ids, other.token_ids]),
                            torch.cat([mask(self), mask(other)]))
