"""What the engine hands back: per-step deltas and vLLM-shaped results.

``RequestOutputDelta`` is what ``Scheduler.update_from_output`` returns for
each request that got tokens or finished in a step. ``CompletionOutput`` and
``RequestOutput`` carry vLLM's names so user code can switch engines;
a finished ``RequestOutput``'s ``metrics`` are its times and token count
(``engine.request_metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request_metrics import RequestStateStats


@dataclass(frozen=True)
class Logprob:
    """One candidate token's log-probability and rank (1 = most likely), and
    its text decoded alone (vLLM's ``decoded_token``: special tokens shown),
    which ``LLM``'s outputs fill in (``engine.output_text.with_decoded_tokens``)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per generated token: candidate token id -> Logprob (the sampled token is
# always among the keys, next to the requested top-N).
TokenLogprobs = dict[int, Logprob]


@dataclass(frozen=True)
class RequestOutputDelta:
    """New tokens of one request in one step.

    ``new_token_ids`` may be empty when the request finished without a new
    token (abort; error: the grammar refused the sampled token).
    ``finish_reason`` is "stop", "length", "abort", "error", "repetition"
    or None, and
    is set exactly when ``finished`` is. ``logprobs`` has one entry per new
    token when the request asked for logprobs and the runner sent them.
    ``prompt_logprobs`` (vLLM's shape: None for the first prompt token) comes
    once, with the first tokens of a request that asked for it.
    ``num_cached_tokens``: the prompt tokens the prefix cache held when the
    request was first scheduled. ``hides_stop_token``: the last new token
    is the stop token (one of ``stop_token_ids`` or an end-of-sequence id)
    that finished the request with "stop", and the request did not ask for
    ``include_stop_str_in_output``; it stays in the token ids, but its text
    is left out of the output's (as vLLM leaves it out; with
    ``include_stop_str_in_output`` vLLM shows it, and so the text keeps it).
    ``stop_reason``: that token's id when it is one of the request's
    ``stop_token_ids`` (``Request.stop_token_ids``: the parameters' own and,
    unless ``ignore_eos``, the model's end ids other than the tokenizer's);
    "repetition_detected" where the output ended in a repetition
    (``engine.repetition``); None for the tokenizer's end-of-sequence id or
    any other ending, as vLLM's.
    """

    req_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_cached_tokens: int | None = None
    hides_stop_token: bool = False
    stop_reason: int | str | None = None
    # A pooling request's output, on its one (finishing) delta: float32
    # little-endian bytes (``engine.pooling_params.embedding_of``,
    # ``engine.classify_head.probabilities_of``; a token-level task's rows,
    # one a prompt token, one after the other).
    pooled: bytes | None = None


def shown_token_ids(delta: RequestOutputDelta, token_ids: list[int],
                    through_end: bool) -> list[int]:
    """The ids among ``token_ids`` whose text the output shows, the one home
    of the rule "a stop token's text is not shown" (as vLLM leaves it out,
    unless the request asks for ``include_stop_str_in_output``: the
    scheduler reads that and sets ``delta.hides_stop_token``).
    ``token_ids`` are the request's tokens up to some point of ``delta``;
    ``through_end``: they run to the delta's last token. Only then, and only
    when that token is the stop token that finished the request and is to
    be hidden (``delta.hides_stop_token``), is it left out; its id stays in
    the output's token ids."""
    if through_end and delta.finished and delta.hides_stop_token:
        return token_ids[:-1]
    return token_ids


def cumulative_logprob(token_ids: list[int],
                       logprobs: list[TokenLogprobs] | None) -> float | None:
    """vLLM's ``cumulative_logprob``: the tokens' log-probabilities summed,
    where the request asked for logprobs (None otherwise)."""
    if logprobs is None:
        return None
    return sum(entry[token].logprob for token, entry in zip(token_ids, logprobs))


@dataclass
class CompletionOutput:
    """One generated sequence of a request (vLLM's name and fields)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop token id or stop string met
    cumulative_logprob: float | None = None  # the tokens' logprobs summed, where asked for

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's prompt and its outputs so far (vLLM's name and fields)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_cached_tokens: int | None = None
    metrics: RequestStateStats | None = None  # set when the output is handed back
