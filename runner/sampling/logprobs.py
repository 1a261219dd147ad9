"""Logprobs of the raw model distribution (vLLM's default "raw_logprobs").

All from ``log_softmax`` of the logits as the model produced them, before
penalties, temperature and filters:

- ``top_token_ids`` / ``top_logprobs`` [N, K]: the K most likely tokens and
  their logprobs, most likely first (K is the batch's largest request; the
  host trims each row to what its request asked for).
- ``sampled_logprobs`` [N]: the sampled token's logprob.
- ``sampled_ranks`` [N]: 1 + the number of other tokens whose logit is
  >= the sampled token's (1 = most likely; a tie counts against it).
"""

from __future__ import annotations

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


def compute_logprobs_ref(
    raw_logits: torch.Tensor, sampled: torch.Tensor, num_top: int
) -> LogprobsTensors:
    """raw_logits [N, V] of any float dtype (computed on in float32), sampled
    [N] int64, num_top >= 0 (host-known)."""
    raw_logits = raw_logits.to(torch.float32)
    logprobs = raw_logits.log_softmax(dim=-1)
    top = logprobs.topk(min(num_top, logprobs.shape[-1]), dim=-1)
    sampled_col = sampled[:, None]
    sampled_logit = raw_logits.gather(1, sampled_col)
    return LogprobsTensors(
        top_token_ids=top.indices,
        top_logprobs=top.values,
        sampled_logprobs=logprobs.gather(1, sampled_col)[:, 0],
        sampled_ranks=(raw_logits >= sampled_logit).sum(dim=-1),
    )
