"""The n-gram (prompt lookup) proposer, on the device.

For batch row i with slot s = idx_mapping[i], the history is
all_token_ids[s, 0 .. h-1] with h = num_computed_tokens[s] + 1: every token
of the request, the one sampled last (at position num_computed_tokens[s],
not yet fed) included. For n from max_n down to min_n, the suffix
history[h-n .. h-1] is searched among earlier windows history[e-n+1 .. e]
with n-1 <= e <= h-2; the first n with a match wins, and among its matches
the latest (largest e). The k drafts are the tokens after the match,
history[e+1+j] for j < k, continued periodically past the history's end
(period p = h-1-e: the match says history repeats with that period there),
i.e. draft j = history[e + 1 + (j mod p)]. A row with no match proposes
its last token k times: fixed shapes, and the rejection sampler simply
rejects what is wrong. Writes draft_tokens[s, 0 .. k-1] for every batch row;
nothing else. No host sync.
"""

from __future__ import annotations

import torch


def check_ngram_propose(all_token_ids: torch.Tensor, idx_mapping: torch.Tensor,
                        draft_tokens: torch.Tensor, num_reqs: int, min_n: int,
                        max_n: int) -> None:
    """Raise ValueError unless the sizes and bounds fit (both versions)."""
    if not 0 <= num_reqs <= idx_mapping.shape[0]:
        raise ValueError(f"num_reqs={num_reqs} outside [0, {idx_mapping.shape[0]}]")
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
    if all_token_ids.stride(1) != 1 or draft_tokens.stride(1) != 1:
        raise ValueError("all_token_ids and draft_tokens rows must be contiguous")


def ngram_propose_ref(all_token_ids: torch.Tensor, idx_mapping: torch.Tensor,
                      num_computed_tokens: torch.Tensor, draft_tokens: torch.Tensor,
                      num_reqs: int, min_n: int, max_n: int) -> None:
    """Torch reference: [rows, max_model_len] temporaries, fixed shapes."""
    if num_reqs == 0:
        return
    slots = idx_mapping[:num_reqs].to(torch.int64)
    tokens = all_token_ids[slots].to(torch.int64)  # [N, M]
    width = tokens.shape[1]
    h = (num_computed_tokens.to(torch.int64)[slots] + 1).clamp(max=width)[:, None]  # [N, 1]
    ends = torch.arange(width, device=tokens.device)[None, :]
    best = torch.full_like(h, -1)
    for n in range(max_n, min_n - 1, -1):
        ok = (ends >= n - 1) & (ends <= h - 2)
        for q in range(n):
            suffix = tokens.gather(1, (h - n + q).clamp(min=0))
            window = tokens.gather(1, (ends - n + 1 + q).clamp(min=0).expand_as(tokens))
            ok &= window == suffix
        latest = torch.where(ok, ends, -1).amax(dim=1, keepdim=True)
        best = torch.where(best < 0, latest, best)
    k = draft_tokens.shape[1]
    j = torch.arange(k, device=tokens.device)[None, :]
    period = h - 1 - best
    src = torch.where(best >= 0, best + 1 + j % period.clamp(min=1), h - 1)
    draft_tokens[slots] = tokens.gather(1, src).to(draft_tokens.dtype)
