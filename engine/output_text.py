"""One output's tokens and text for ``LLM``, cut at its first stop string.

An output without stop strings (``SamplingParams.stop``) keeps every token
the engine gives it and is decoded once, when it finishes: its text is
``checkpoint.tokenizer.output_text`` of its ids, the text they add after
the prompt (as vLLM decodes it; for a byte-level tokenizer the ids' text
less an incomplete character at its end, which vLLM's detokenizer never
releases), the same text the token-by-token decode gives. One with stop strings is decoded token by
token (``IncrementalDetokenizer``) through a ``StopStringMatcher``, so that
``LLM`` can end the request the step its text meets one (``OutputStops``). The token whose
text completes the stop string is the last one kept (tokens after it in
the same step are dropped), and the text ends before
the stop string (after it with ``include_stop_str_in_output``). As vLLM,
text of the first ``min_tokens`` tokens ends no stop string, though one
may begin in it (``StopStringMatcher.release``). Both decode as
``skip_special_tokens`` and ``spaces_between_special_tokens`` say.

In both, the text of the stop token that ended an output is left out
(shown with ``include_stop_str_in_output``, as vLLM shows it), and its id
kept (``engine.outputs.shown_token_ids``).

With ``detokenize`` False (no stop strings then) nothing is decoded, as
vLLM drops the request's tokenizer: ``tokenizer`` is None, the text stays
empty and each logprob's ``decoded_token`` None.

Nothing is copied whole per token: the text shown so far is kept as its
pieces (joined where ``text`` is asked for) and the logprobs list is
extended where it lies, so a long output costs its length.
"""

from __future__ import annotations

from checkpoint.growing_text import GrowingText
from checkpoint.tokenizer import IncrementalDetokenizer, output_text
from engine.outputs import Logprob, RequestOutputDelta, TokenLogprobs, shown_token_ids
from engine.sampling_params import SamplingParams
from engine.stop_strings import OutputStops


class OutputText:
    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer if params.detokenize else None
        self.prompt_token_ids = prompt_token_ids
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] | None = None
        self._shown = GrowingText()  # the text shown so far
        self.stop_string: str | None = None  # the stop string met, once met
        self._stops = (OutputStops(params.stop, params.include_stop_str_in_output,
                                   params.min_tokens) if params.stop else None)
        self.skip_special_tokens = params.skip_special_tokens
        self.spaces_between_special_tokens = params.spaces_between_special_tokens
        self._detokenizer = (IncrementalDetokenizer(tokenizer, prompt_token_ids,
                                                    params.skip_special_tokens,
                                                    params.spaces_between_special_tokens)
                             if params.stop else None)

    @property
    def text(self) -> str:
        """The text shown so far (the whole output's once ``finish`` ran)."""
        return str(self._shown)

    def add(self, delta: RequestOutputDelta) -> None:
        """Take the delta's tokens (and their logprobs), up to the one that
        completes a stop string if one does (then ``stop_string`` is set)."""
        kept = self._feed(delta)
        self.token_ids.extend(delta.new_token_ids[:kept])
        if delta.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(with_decoded_tokens(self.tokenizer, delta.logprobs[:kept]))

    def _feed(self, delta: RequestOutputDelta) -> int:
        """How many of the delta's tokens to keep; feeds the text of those
        shown to the matcher, one token at a time."""
        if self._stops is None:
            return len(delta.new_token_ids)
        for i, token in enumerate(shown_token_ids(delta, delta.new_token_ids, True)):
            self._shown.add(self._stops.add(self._detokenizer.feed([token]), 1))
            if self._stops.stopped is not None:
                self.stop_string = self._stops.stopped
                return i + 1
        return len(delta.new_token_ids)

    def finish(self, delta: RequestOutputDelta) -> None:
        """The output has ended with ``delta`` (not at a stop string ``add``
        found): its whole text (what the detokenizer still holds back, an
        incomplete character, is left out, as vLLM leaves it), with the
        tail the stop-string matcher held back."""
        if self._stops is None:
            if self.tokenizer is not None:
                self._shown.add(output_text(self.tokenizer, self.prompt_token_ids,
                                            shown_token_ids(delta, self.token_ids, True),
                                            self.skip_special_tokens,
                                            self.spaces_between_special_tokens))
            return
        self._shown.add(self._stops.add("", 0, last=True))
        self.stop_string = self._stops.stopped


def with_decoded_tokens(tokenizer, logprobs: list[TokenLogprobs | None]
                        ) -> list[TokenLogprobs | None]:
    """``logprobs`` with each candidate's ``decoded_token`` set: its id
    decoded alone, special tokens shown (as vLLM decodes them); as they
    are (``decoded_token`` None) without a ``tokenizer``."""
    if tokenizer is None:
        return list(logprobs)
    return [None if token is None else
            {t: Logprob(lp.logprob, lp.rank, tokenizer.decode([t], False))
             for t, lp in token.items()}
            for token in logprobs]
