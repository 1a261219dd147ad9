"""``CompletionCollector``: one engine request's completion, gathered from
the engine endpoint's deltas (``ipc.engine_messages.Delta``) one at a time,
for every client that reads them: the blocking
``serving.client.EngineClient`` and ``serving.async_llm.AsyncLLM``.

The endpoint takes no stop strings, so the collector cuts the text at them
(``engine.stop_strings.OutputStops``, on each delta's text): ``add`` says
when a delta's text met one while the engine still runs the request, which
the caller then aborts. The tokens kept run to that delta's; what the
engine still sends for the request (the abort's own delta, tokens of a step
already under way) is dropped, but for the prompt's side (its logprobs,
its prefix-cache hits), taken from whichever delta carries it.

Two views of what has come: ``completion()``, everything so far (vLLM's
``RequestOutputKind.CUMULATIVE``), and ``new_completion()``, only what came
since its last call (``DELTA``): text, token ids and logprobs. Both carry
the finish and stop reasons once finished, and the cumulative logprob of
every token so far (vLLM's delta outputs carry the whole sum too).
Invariant: the ``new_completion()`` texts, token ids and logprobs, joined
in order, are ``completion()``'s.

Given a ``tokenizer`` (an in-process caller has the engine's), each
logprob's ``decoded_token`` is set as ``LLM`` sets it
(``engine.output_text.with_decoded_tokens``); without one it is None.

Cost: a delta costs its own size. The text is kept as its pieces
(``GrowingText``), the logprobs list extended where it lies, the
cumulative logprob summed as tokens come (in the tokens' order, the
``engine.outputs.cumulative_logprob`` sum); ``completion()`` costs the
completion's length (it joins and copies), ``new_completion()`` only the
new part.
"""

from __future__ import annotations

from checkpoint.growing_text import GrowingText
from engine.output_text import with_decoded_tokens
from engine.outputs import CompletionOutput, Logprob, TokenLogprobs
from engine.request_metrics import RequestTimes
from engine.sampling_params import SamplingParams
from engine.stop_strings import OutputStops
from ipc.engine_messages import Delta, TokenLogprob


class CompletionCollector:
    """Choice ``index`` of a request; ``times`` takes when its tokens were
    received. ``num_taken``: the deltas taken so far (a dropped one is not
    counted), by which a caller sees whether there is news."""

    def __init__(self, index: int, params: SamplingParams, times: RequestTimes,
                 tokenizer=None) -> None:
        self.index = index
        self.times = times
        self.tokenizer = tokenizer if params.detokenize else None
        self.text = GrowingText()
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] | None = None
        self.cumulative_logprob: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.prompt_logprobs: list[TokenLogprobs | None] | None = None
        self.num_cached_tokens: int | None = None
        self.num_taken = 0
        self._stops = (OutputStops(params.stop, params.include_stop_str_in_output,
                                   params.min_tokens) if params.stop else None)
        self._seen_text = 0  # where the last new_completion() ended
        self._seen_tokens = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, delta: Delta, received_at: float) -> bool:
        """Take one delta, received at ``received_at`` (``time.monotonic()``);
        whether its text met a stop string while the engine goes on with
        the request (the caller aborts the request then)."""
        self._take_prompt_side(delta)
        if self.finished:
            return False  # stopped at a stop string: what the engine still sends is dropped
        self.num_taken += 1
        if delta.token_ids:
            self.times.tokens_at(received_at)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self._take_logprobs(delta)
        if self._stops is None:
            self.text.add(delta.text)
        else:
            self.text.add(self._stops.add(delta.text, len(delta.token_ids), delta.finished))
            if self._stops.stopped is not None:
                self.finish_reason, self.stop_reason = "stop", self._stops.stopped
                return not delta.finished
        if delta.finished:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason
        return False

    def completion(self) -> CompletionOutput:
        """Everything so far (its own copies: later deltas change nothing of it)."""
        return CompletionOutput(self.index, str(self.text), list(self.token_ids),
                                self.finish_reason,
                                None if self.logprobs is None else list(self.logprobs),
                                self.stop_reason, self.cumulative_logprob)

    def new_completion(self) -> CompletionOutput:
        """What came since the last call (the first call: since the start)."""
        text = self.text.span(self._seen_text)
        start, self._seen_text = self._seen_tokens, len(self.text)
        self._seen_tokens = len(self.token_ids)
        return CompletionOutput(self.index, text, self.token_ids[start:], self.finish_reason,
                                None if self.logprobs is None else self.logprobs[start:],
                                self.stop_reason, self.cumulative_logprob)

    def _take_logprobs(self, delta: Delta) -> None:
        entries = with_decoded_tokens(self.tokenizer, [_token_logprobs(token)
                                                       for token in delta.logprobs])
        if self.logprobs is None:
            self.logprobs, self.cumulative_logprob = [], 0
        self.logprobs.extend(entries)
        for token, entry in zip(delta.token_ids, entries):
            self.cumulative_logprob += entry[token].logprob

    def _take_prompt_side(self, delta: Delta) -> None:
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = with_decoded_tokens(
                self.tokenizer, [None if token is None else _token_logprobs(token)
                                 for token in delta.prompt_logprobs])
        if delta.num_cached_tokens is not None:
            self.num_cached_tokens = delta.num_cached_tokens


def _token_logprobs(candidates: list[TokenLogprob]) -> TokenLogprobs:
    return {e.token_id: Logprob(e.logprob, e.rank) for e in candidates}
