"""Logprobs of the raw model distribution (vLLM's default "raw_logprobs").

All from ``log_softmax`` of the logits as the model produced them, before
penalties, temperature and filters:

- ``top_token_ids`` / ``top_logprobs`` [N, K]: the K most likely tokens and
  their logprobs, most likely first (K is the batch's largest request; the
  host trims each row to what its request asked for).
- ``sampled_logprobs`` [N]: the sampled token's logprob.
- ``sampled_ranks`` [N]: 1 + the number of other tokens whose logit is
  >= the sampled token's (1 = most likely; a tie counts against it).

With ``token_ids`` [N, W] (int64, -1: none; a request's
``logprob_token_ids``, ``runner.sampling.logprob_token_ids``) the first W
top columns of a row hold those ids and their logprobs instead, where the
id is not -1: the same log-softmax, read at the asked ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogprobsTensors:
    top_token_ids: torch.Tensor  # [N, K] int64
    top_logprobs: torch.Tensor  # [N, K] float32
    sampled_logprobs: torch.Tensor  # [N] float32
    sampled_ranks: torch.Tensor  # [N] int64

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.top_token_ids, self.top_logprobs, self.sampled_logprobs, self.sampled_ranks)


def with_token_ids(
    top_ids: torch.Tensor, top_logprobs: torch.Tensor, token_ids: torch.Tensor | None,
    logprobs_at: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top columns with ``token_ids`` written over the first ones where
    an id is asked (not -1); ``logprobs_at(ids)`` [N, W] float32 are the
    logprobs of ids [N, W] (every one inside the vocabulary)."""
    if token_ids is None:
        return top_ids, top_logprobs
    width = min(token_ids.shape[1], top_ids.shape[1])
    asked = token_ids[:, :width]
    valid = asked >= 0
    ids = asked.clamp(min=0)
    head_ids = torch.where(valid, ids, top_ids[:, :width])
    head_logprobs = torch.where(valid, logprobs_at(ids), top_logprobs[:, :width])
    return (torch.cat((head_ids, top_ids[:, width:]), dim=1),
            torch.cat((head_logprobs, top_logprobs[:, width:]), dim=1))


def compute_logprobs_ref(
    raw_logits: torch.Tensor, sampled: torch.Tensor, num_top: int,
    token_ids: torch.Tensor | None = None,
) -> LogprobsTensors:
    """raw_logits [N, V] of any float dtype (computed on in float32), sampled
    [N] int64, num_top >= 0 (host-known), token_ids as above."""
    raw_logits = raw_logits.to(torch.float32)
    logprobs = raw_logits.log_softmax(dim=-1)
    top = logprobs.topk(min(num_top, logprobs.shape[-1]), dim=-1)
    top_ids, top_logprobs = with_token_ids(top.indices, top.values, token_ids,
                                           lambda ids: logprobs.gather(1, ids))
    sampled_col = sampled[:, None]
    sampled_logit = raw_logits.gather(1, sampled_col)
    return LogprobsTensors(
        top_token_ids=top_ids,
        top_logprobs=top_logprobs,
        sampled_logprobs=logprobs.gather(1, sampled_col)[:, 0],
        sampled_ranks=(raw_logits >= sampled_logit).sum(dim=-1),
    )
