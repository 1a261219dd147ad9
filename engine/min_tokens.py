"""The engine's side of ``min_tokens``: which ids the runner holds back."""

from __future__ import annotations

from engine.request import Request


def min_tokens_stop_ids(request: Request) -> list[int]:
    """The ids ``min_tokens`` holds back for ``request``: its stop token ids
    and its end-of-sequence ids, with ``ignore_eos`` too (vLLM's: no EOS is
    generated before ``min_tokens``, whether or not it would end the
    request); none when it has no ``min_tokens``."""
    params = request.sampling_params
    if params.min_tokens == 0:
        return []
    return sorted(set(params.stop_token_ids) | request.eos_token_ids)
