"""min-p, top-k and top-p on temperature-scaled logits, as per-row thresholds.

Each filter keeps the tokens whose logit is at or above a per-row threshold
and sets the others to -inf; a disabled filter has threshold -inf. Ties
with the threshold are kept, so a filter may keep more than k tokens when
logits tie, never fewer. The most likely token always survives.

- min-p (``min_p`` in [0, 1]; 0 = off): keep t if p_t >= min_p * max_t' p_t',
  i.e. l_t >= max(l) + log(min_p).
- top-k (``top_k`` >= 0; 0 = off): keep the k largest logits (threshold: the
  k-th largest value; k >= V keeps all).
- top-p (``top_p`` in (0, 1]; 1 = off): after top-k, keep the smallest set of
  most likely tokens whose probability reaches top_p: token t is kept when
  the probability of the tokens ranked above it is < top_p.

Order (as vLLM's GPU model runner): min-p, then top-k, then top-p over the
distribution that top-k leaves. Only fixed-shape tensor ops: no host sync.

The draw takes the filters as one threshold a row on the *raw* logits
(``filter_thresholds_ref``): dividing by a positive temperature never
reverses an order, so the tokens a filter keeps of the scaled row are
exactly the raw ones at or above the least raw logit it keeps. The draw
then needs neither the scaled row nor the filtered copy. The Triton
version (``triton_filters.py``) finds the same thresholds without sorting.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_NEG_INF = float("-inf")


def scale_by_temperature(logits: torch.Tensor, slots: torch.Tensor,
                         temperature: torch.Tensor) -> torch.Tensor:
    """float32 [N, V]: each row of ``logits`` divided by its slot's
    temperature (the per-slot table read at ``slots``), a greedy row's
    (temperature 0) by 1; -inf stays -inf (not NaN at temperature inf)."""
    raw = logits.to(torch.float32)
    t = temperature[slots]
    scaled = raw / torch.where(t == 0.0, 1.0, t)[:, None]
    return torch.where(raw == _NEG_INF, raw, scaled)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """logits [N, V] float32, min_p [N] -> filtered logits (a new tensor)."""
    threshold = logits.amax(dim=-1) + torch.log(min_p)  # log(0) = -inf: off
    return logits.masked_fill(logits < threshold[:, None], _NEG_INF)


def _kth_largest(desc: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """[N] threshold of top-k from values sorted descending ([N, W], W <= V)."""
    k = top_k.to(torch.int64).clamp(1, desc.shape[-1])
    kth = desc.gather(1, (k - 1)[:, None])[:, 0]
    return torch.where(top_k > 0, kth, _NEG_INF)


def _top_p_threshold(desc: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[N] threshold of top-p from all values sorted descending ([N, V])."""
    probs = desc.softmax(dim=-1)
    mass_above = F.pad(probs[:, :-1].cumsum(dim=-1), (1, 0))  # exclusive cumsum
    # The largest value is always kept: mass_above[:, 0] = 0, and a top_p that
    # rounds to 0 in float32 keeps one value rather than none.
    num_kept = (mass_above < top_p[:, None]).sum(dim=-1).clamp(min=1)
    threshold = desc.gather(1, (num_kept - 1)[:, None])[:, 0]
    return torch.where(top_p < 1.0, threshold, _NEG_INF)


def apply_top_k_top_p(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    max_top_k: int,
    any_top_p: bool,
) -> torch.Tensor:
    """logits [N, V] float32; top_k [N] int; top_p [N] float -> filtered logits.

    ``max_top_k`` (0 = no row uses top-k) and ``any_top_p`` come from the
    host: without top-p, only the ``max_top_k`` largest values are found
    (``torch.topk``) instead of sorting whole rows.
    """
    if any_top_p:
        desc = logits.sort(dim=-1, descending=True).values
    else:
        width = min(max(max_top_k, 1), logits.shape[-1])
        desc = logits.topk(width, dim=-1).values
    kth = _kth_largest(desc, top_k)
    threshold = kth
    if any_top_p:
        desc = desc.masked_fill(desc < kth[:, None], _NEG_INF)
        threshold = torch.maximum(kth, _top_p_threshold(desc, top_p))
    return logits.masked_fill(logits < threshold[:, None], _NEG_INF)


def filter_thresholds_ref(
    logits: torch.Tensor, slots: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
    top_p: torch.Tensor, min_p: torch.Tensor, any_min_p: bool, max_top_k: int, any_top_p: bool,
) -> torch.Tensor:
    """float32 [N]: per row, the least raw logit that min-p, top-k and top-p
    keep of the row scaled by its slot's temperature (-inf for a greedy
    row: its filters are off); ``logits`` [N, V] any float dtype, the
    per-slot tables ``temperature``, ``top_k``, ``top_p``, ``min_p`` read at
    ``slots`` [N] (int64). ``any_min_p``, ``max_top_k`` and ``any_top_p``
    are the batch's host flags: the filters no row uses are skipped. A row
    keeps the tokens whose raw logit is at or above its threshold."""
    raw = logits.to(torch.float32)
    t = temperature[slots]
    scaled = scale_by_temperature(raw, slots, temperature)
    if any_min_p:
        scaled = apply_min_p(scaled, min_p[slots])
    if max_top_k > 0 or any_top_p:
        scaled = apply_top_k_top_p(scaled, top_k[slots], top_p[slots], max_top_k, any_top_p)
    least_kept = torch.where(scaled > _NEG_INF, raw, float("inf")).amin(dim=-1)
    return torch.where(t == 0.0, _NEG_INF, least_kept)
