"""From an OpenAI request's fields to the engine's ``SamplingParams`` (as
dicts, one per choice), checked here with the engine's own validation so a
bad value is answered with the engine's message before anything is sent.

Unset fields take the model's recommended sampling where its
generation_config.json gives one (``LLMEngine.sampling_defaults``, as vLLM's
server takes them), else the engine's defaults (OpenAI's: temperature 1,
top_p 1); the recommended ``max_tokens`` caps every request's
(``capped_max_tokens``). The ``n`` choices and their seeds are
``SamplingParams.choices``'.
"""

from __future__ import annotations

from engine.request import check_logprobs_limit
from engine.sampling_params import SamplingParams
from engine.structured_outputs.params import StructuredOutputsParams
from serving.http.protocol import SamplingFields
from serving.http.structured import structured_outputs_of

_OPTIONAL = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
             "frequency_penalty", "repetition_penalty")


def capped_max_tokens(max_tokens: int | None, defaults: dict, room: int) -> int | None:
    """A request's ``max_tokens`` (None: what the context leaves, ``room``
    for the prompt) under the recommended cap in ``defaults``, as
    vLLM caps it; None where the prompt leaves no room (the engine says so)."""
    cap = defaults.get("max_tokens")
    if cap is None:
        return max_tokens
    if max_tokens is not None:
        return min(max_tokens, cap)
    return min(cap, room) if room >= 1 else None


def check_logprobs(max_logprobs: int, vocab_size: int | None, **asked: int | None) -> None:
    """The engine's rule on top logprobs per token
    (``engine.request.check_logprobs_limit``: at most ``max_logprobs``, -1:
    any; a request's -1 asks for all ``vocab_size`` tokens) ahead of the
    engine, for each field that ``asked`` (None:
    nothing), named as the client sent it: ``top_logprobs`` in chat and
    Responses, ``logprobs`` in completions, ``prompt_logprobs``; the error
    (a 400) names that field. The engine would refuse the same request in
    its own names (``logprobs`` for the chat's ``top_logprobs``)."""
    for name, value in asked.items():
        check_logprobs_limit(value, max_logprobs, name, vocab_size)


def choice_params(request: SamplingFields, max_tokens: int | None, logprobs: int | None,
                  prompt_logprobs: int | None = None,
                  constraint: StructuredOutputsParams | None = None,
                  defaults: dict | None = None,
                  skip_special_tokens: bool | None = None) -> list[dict]:
    """One ``SamplingParams`` dict per choice (``SamplingParams.choices``);
    ``ValueError`` for bad values. ``prompt_logprobs`` defaults to the
    request's own field; ``max_tokens`` None: what the context leaves;
    ``constraint``: the output's constraint where the caller made it (a
    tool choice's, given only to a request without structured-output
    fields), else the one those fields ask for; ``skip_special_tokens``:
    where the caller decided it (``ToolChoice.skip_special_tokens``), else
    the request's. ``logprobs``: the route's count, None where the request
    gives ``logprob_token_ids`` (their number is the count). The stop strings are
    checked here and applied by ``Generation``: the dicts carry none."""
    fields = {name: getattr(request, name) for name in _OPTIONAL
              if getattr(request, name) is not None}
    for name, value in (defaults or {}).items():
        if name != "max_tokens":  # capped_max_tokens'
            fields.setdefault(name, value)
    fields.update(n=request.n, max_tokens=max_tokens, ignore_eos=request.ignore_eos,
                  logprobs=logprobs, stop=request.stop_strings(),
                  stop_token_ids=list(request.stop_token_ids or []), seed=request.seed,
                  structured_outputs=(constraint if constraint is not None
                                      else structured_outputs_of(request)),
                  min_tokens=request.min_tokens, logit_bias=request.token_biases(),
                  allowed_token_ids=request.allowed_token_ids, bad_words=request.bad_words,
                  thinking_token_budget=request.thinking_token_budget,
                  repetition_detection=request.repetition_detection,
                  logprob_token_ids=request.logprob_token_ids or None,
                  include_stop_str_in_output=request.include_stop_str_in_output,
                  truncate_prompt_tokens=request.truncate_prompt_tokens,
                  skip_special_tokens=(request.skip_special_tokens if skip_special_tokens
                                       is None else skip_special_tokens),
                  spaces_between_special_tokens=request.spaces_between_special_tokens,
                  prompt_logprobs=(request.prompt_logprobs if prompt_logprobs is None
                                   else prompt_logprobs),
                  extra_args=request.vllm_xargs)
    out = []
    for choice in SamplingParams.from_dict(fields).choices():
        params = dict(choice.to_dict(), stop=[])
        params["stop_token_ids"] = list(params["stop_token_ids"])
        out.append(params)
    return out
