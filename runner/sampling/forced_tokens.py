"""Tokens a step must sample, whatever the requests' own token limits say.

A request's thinking budget, once spent, forces the end of its reasoning
(``GrammarBitmask.forced_token_ids``). Its grammar-mask row already allows
that token alone, but the sampler's own masks come after the grammar mask:
``allowed_token_ids`` without the token, a bad word ending in it, or
``min_tokens`` holding it back as a stop id would leave the row no token at
all. vLLM forces the token after those masks (its budget runs last among
its logits processors), so the forced token wins; ``ForcedTokens.apply``,
called by ``Sampler.draw`` after the request's own masks and penalties,
does the same: the row keeps the forced token alone, at logit 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ForcedTokens:
    """``rows`` int64 [k]: logits rows (distinct); ``token_ids`` int64 [k]:
    the token each row must sample. Both on the logits' device."""

    rows: torch.Tensor
    token_ids: torch.Tensor

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (float32, the sampler's own copy) with each forced row
        -inf but at its token, in place; no host sync."""
        logits.index_fill_(0, self.rows, float("-inf"))
        logits.index_put_((self.rows, self.token_ids),
                          torch.zeros((), dtype=logits.dtype, device=logits.device))
        return logits
