"""Float64 references of the sampling filters, for tests: the tokens that
min-p, then top-k, then top-p keep of a row scaled by a temperature, and
the distribution the draw should follow over them."""

from __future__ import annotations

import math

import numpy as np


def reference_allowed(row, temperature, top_k=0, top_p=1.0, min_p=0.0, slack=0.0):
    """Tokens min-p, then top-k, then top-p keep (float64; slack widens the set)."""
    scaled = row.astype(np.float64) / temperature
    keep = np.ones(len(row), dtype=bool)
    if min_p > 0:
        keep &= scaled >= scaled.max() + math.log(min_p) - slack
    if top_k > 0:
        kth = np.sort(scaled[keep])[::-1][min(top_k, int(keep.sum())) - 1]
        keep &= scaled >= kth - slack
    if top_p < 1:
        order = [t for t in np.argsort(-scaled, kind="stable") if keep[t]]
        probs = np.exp(scaled[order] - scaled[order].max())
        probs /= probs.sum()
        mass_above = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
        dropped = [t for t, m in zip(order, mass_above) if m >= top_p + slack]
        keep[dropped] = False
    return keep


def reference_distribution(row, temperature, **filters):
    keep = reference_allowed(row, temperature, **filters)
    scaled = row.astype(np.float64) / temperature
    probs = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
    return probs / probs.sum()
