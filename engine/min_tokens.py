"""The engine's side of ``min_tokens``: which ids the runner holds back."""

from __future__ import annotations

from engine.request import Request


def min_tokens_stop_ids(request: Request) -> list[int]:
    """The ids ``min_tokens`` holds back for ``request`` (as vLLM): its stop
    token ids, and its end-of-sequence ids unless it ignores them; none when
    it has no ``min_tokens``."""
    params = request.sampling_params
    if params.min_tokens == 0:
        return []
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids |= request.eos_token_ids
    return sorted(ids)
