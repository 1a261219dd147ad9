"""``RequestCollector``: one prompt's ``n`` engine requests (its choices,
``SamplingParams.choices``), each a ``CompletionCollector``, gathered into
vLLM's ``RequestOutput``: the final one (``final``, what ``generate`` calls
return) and, for a streaming caller, the ones its ``output_kind`` asks
for (``output``).

``output`` follows vLLM's ``AsyncLLM``: CUMULATIVE gives each choice that
has news with everything it holds so far; DELTA only what is new since the
last output (the prompt's logprobs in the first output that has them,
never again); FINAL_ONLY nothing until every choice has finished, then
``final()``. With ``n`` > 1 a streamed output holds the choices that have
news since the last one, in index order (as vLLM's child requests each
report their own completion; where several came meanwhile they are merged
into one output, as vLLM merges outputs that wait for a slow consumer).
An output is ``finished`` once every choice is, and only then has its
``metrics`` (``engine.request_metrics.request_stats`` over the choices'
times); the prompt's logprobs and prefix-cache hits are the first
choice's, its token ids those the caller sets (every choice has the same).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.outputs import RequestOutput
from engine.request_metrics import RequestTimes, request_stats
from engine.sampling_params import RequestOutputKind, SamplingParams
from serving.completion_collector import CompletionCollector


class RequestCollector:
    """``times``: one ``RequestTimes`` a choice (their arrivals: when each
    engine request was sent); ``prompt_token_ids`` is set by the caller
    once the engine has accepted a choice."""

    def __init__(self, request_id: str, prompt: str | None, params: SamplingParams,
                 times: Sequence[RequestTimes], tokenizer=None) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.kind = params.output_kind
        self.choices = [CompletionCollector(i, params, t, tokenizer)
                        for i, t in enumerate(times)]
        self.prompt_token_ids: list[int] = []
        self._seen = [0] * len(self.choices)  # each choice's num_taken at the last output
        self._prompt_logprobs_shown = False

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.choices)

    def output(self) -> RequestOutput | None:
        """What the caller is to get now, as ``output_kind`` says; None:
        nothing new to show."""
        if self.kind is RequestOutputKind.FINAL_ONLY:
            return self.final() if self.finished else None
        fresh = [c for c in self.choices if c.num_taken > self._seen[c.index]]
        if not fresh:
            return None
        for c in fresh:
            self._seen[c.index] = c.num_taken
        delta = self.kind is RequestOutputKind.DELTA
        completions = [c.new_completion() if delta else c.completion() for c in fresh]
        prompt_logprobs = self.choices[0].prompt_logprobs
        if delta and prompt_logprobs is not None:
            prompt_logprobs, self._prompt_logprobs_shown = (
                None if self._prompt_logprobs_shown else prompt_logprobs, True)
        return self._output(completions, prompt_logprobs)

    def final(self) -> RequestOutput:
        """Every choice whole (the request has finished)."""
        return self._output([c.completion() for c in self.choices],
                            self.choices[0].prompt_logprobs)

    def _output(self, completions, prompt_logprobs) -> RequestOutput:
        finished = self.finished
        metrics = None
        if finished:
            metrics = request_stats([c.times for c in self.choices],
                                    sum(len(c.token_ids) for c in self.choices))
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, completions,
                             finished=finished, prompt_logprobs=prompt_logprobs,
                             num_cached_tokens=self.choices[0].num_cached_tokens,
                             metrics=metrics)
