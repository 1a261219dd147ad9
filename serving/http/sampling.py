"""From an OpenAI request's fields to the engine's ``SamplingParams`` (as
dicts, one per choice), checked here with the engine's own validation so a
bad value is answered with the engine's message before anything is sent.

Unset fields keep the engine's defaults (OpenAI's: temperature 1, top_p 1).
With ``n`` > 1 and a ``seed``, choice i samples with seed + i, so the
choices differ yet the whole answer is reproducible.
"""

from __future__ import annotations

from engine.sampling_params import SamplingParams
from serving.http.protocol import SamplingFields
from serving.http.structured import structured_outputs_of

MAX_N = 128
_OPTIONAL = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
             "frequency_penalty", "repetition_penalty")


def choice_params(request: SamplingFields, max_tokens: int, logprobs: int | None,
                  prompt_logprobs: int | None = None) -> list[dict]:
    """One ``SamplingParams`` dict per choice; ``ValueError`` for bad values.
    ``prompt_logprobs`` defaults to the request's own field."""
    if not 1 <= request.n <= MAX_N:
        raise ValueError(f"n must be in [1, {MAX_N}], got {request.n}")
    fields = {name: getattr(request, name) for name in _OPTIONAL
              if getattr(request, name) is not None}
    fields.update(max_tokens=max_tokens, ignore_eos=request.ignore_eos, logprobs=logprobs,
                  stop_token_ids=list(request.stop_token_ids or []), seed=request.seed,
                  structured_outputs=structured_outputs_of(request),
                  min_tokens=request.min_tokens,
                  prompt_logprobs=(request.prompt_logprobs if prompt_logprobs is None
                                   else prompt_logprobs))
    params = SamplingParams.from_dict(fields).to_dict()
    params["stop_token_ids"] = list(params["stop_token_ids"])
    if any(not s for s in request.stop_strings()):
        raise ValueError("a stop string must not be empty")
    out = []
    for i in range(request.n):
        out.append(dict(params, seed=None if request.seed is None else _seed_of(request.seed, i)))
    return out


def _seed_of(seed: int, choice: int) -> int:
    """seed + choice, wrapped into the signed 64-bit range seeds live in."""
    return (seed + choice + (1 << 63)) % (1 << 64) - (1 << 63)


def default_max_tokens(max_model_len: int, num_prompt_tokens: int) -> int:
    """What is left of the context after the prompt (at least 1, so a prompt
    that is already too long gets the engine's length message)."""
    return max(1, max_model_len - num_prompt_tokens)
