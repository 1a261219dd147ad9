"""The engine's side of ``min_tokens``: which ids the runner holds back."""

from __future__ import annotations

import msgspec

from engine.request import Request
from ipc.messages import SamplingOptions


def runner_options(request: Request) -> SamplingOptions:
    """The request's ``SamplingOptions``, with the ids ``min_tokens`` holds
    back: its stop token ids, and its end-of-sequence ids unless it ignores
    them (as vLLM)."""
    options = request.sampling_params.to_options()
    params = request.sampling_params
    if params.min_tokens == 0:
        return options
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids |= request.eos_token_ids
    return msgspec.structs.replace(options, min_tokens_stop_ids=sorted(ids))
