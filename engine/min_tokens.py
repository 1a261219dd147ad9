"""The engine's side of ``min_tokens``: which ids the runner holds back."""

from __future__ import annotations

from engine.request import Request


def min_tokens_stop_ids(request: Request) -> list[int]:
    """The ids ``min_tokens`` holds back for ``request``: its stop token ids
    and every end-of-sequence id, with ``ignore_eos`` too
    (``Request.all_stop_token_ids``, vLLM's: no EOS is generated before
    ``min_tokens``, whether or not it would end the request); none when it
    has no ``min_tokens``."""
    if request.sampling_params.min_tokens == 0:
        return []
    return sorted(request.all_stop_token_ids)
