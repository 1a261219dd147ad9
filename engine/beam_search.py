"""Beam search (vLLM's ``LLM.beam_search``): the ``beam_width`` best
continuations of each prompt, found one token at a time.

A step runs every live beam as a request of its own (the prompt and the
beam's tokens so far, for one token; the prefix cache holds all but the
newest tokens, so a step computes about one token a beam) that returns the
top ``2 * beam_width`` logprobs of the raw distribution, with the sampled
token beside them (greedy at ``temperature`` 0, as vLLM's). Each (beam,
candidate) pair is a new beam, its cumulative logprob the beam's plus the
candidate's. One ending in an end-of-sequence id (unless ``ignore_eos``) is
complete and leaves the search; of the others the ``beam_width`` best by
score live on. Score (``score``): cumulative logprob / length **
length_penalty, the length counting the prompt and the tokens, less a final
end-of-sequence id (vLLM's rule). The search ends after ``max_tokens``
steps, once no beam lives, or where the context is full; then the complete
and the live beams together, best score first, give the answer's
``beam_width`` sequences.

Why 2 * beam_width candidates a beam: the best ``beam_width`` continuations
of all beams are each among their own beam's best ``beam_width``, and
``beam_width`` more cover those that end the sequence, as transformers'
beam search takes them. A beam's request asks for that many logprobs, so
``2 * beam_width`` must be within the engine's ``max_logprobs`` (checked
before anything runs).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from engine.outputs import TokenLogprobs
from engine.sampling_params import SamplingParams
from ipc.errors import InvalidRequestError

_LOG_FLOAT_MAX = math.log(sys.float_info.max)


class BeamSearchParams(msgspec.Struct, kw_only=True):
    """vLLM's beam search parameters; checked when a search starts.
    ``include_stop_str_in_output`` is taken as vLLM's ``LLM.beam_search``
    takes it, changing nothing: a sequence's text is all its tokens."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def check(self, max_logprobs: int) -> None:
        """``InvalidRequestError`` naming the first field out of its range."""
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidRequestError(f"{name} must be an int >= 1, got {value!r}")
        if -1 < max_logprobs < 2 * self.beam_width:
            raise InvalidRequestError(f"beam_width {self.beam_width} needs {2 * self.beam_width} "
                                      f"logprobs a token, more than max_logprobs {max_logprobs}")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.length_penalty, (int, float)) or isinstance(
                self.length_penalty, bool) or not math.isfinite(self.length_penalty):
            raise InvalidRequestError(f"length_penalty must be a finite number, got "
                                      f"{self.length_penalty!r}")
        # temperature: SamplingParams' own check, where the step's params are made.


@dataclass
class BeamSearchSequence:
    """One sequence of the answer: ``tokens`` the prompt's and the
    generated ones (vLLM's shape), ``logprobs`` each generated token's
    candidates, ``text`` all of ``tokens`` decoded (special tokens skipped,
    as tprun's outputs skip them); ``finish_reason`` "stop" for one that
    ended in an end-of-sequence id, else "length"."""

    tokens: list[int]
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """A prompt's best sequences, best first."""

    sequences: list[BeamSearchSequence]


def score(sequence: BeamSearchSequence, eos_token_ids: frozenset[int],
          length_penalty: float) -> float:
    """Cumulative logprob over length ** length_penalty (length: prompt and
    tokens, a final end-of-sequence id not counted, at least 1). Computed through
    logarithms, so any length_penalty gives a number, never an overflow or
    a division by zero: one past the float range is its most negative
    value, one below it 0."""
    length = max(1, len(sequence.tokens) - (sequence.tokens[-1] in eos_token_ids))
    if sequence.cum_logprob == 0:
        return 0.0
    magnitude = math.log(-sequence.cum_logprob)
    if length > 1:  # length 1: any power is 1
        magnitude -= length_penalty * math.log(length)
    return -math.exp(min(magnitude, _LOG_FLOAT_MAX))


class BeamSearch:
    """The search of several prompts (token ids; ``InvalidRequestError`` for
    one that is empty or leaves no room in the context), driven a step at a time
    by its caller: ``requests`` gives the step's one-token requests (the
    token ids of each, run with ``step_params``; none once the search is
    over), ``advance`` takes their candidates in the same order, ``outputs``
    the answer. ``LLM.beam_search`` drives it with ``generate``; the HTTP
    server with its engine link.

    ``keep_eos``: whether a sequence that ended keeps its end-of-sequence
    id among its tokens (vLLM keeps it in ``LLM``'s answers; its server only
    with ``include_stop_str_in_output``)."""

    def __init__(self, prompts: Sequence[list[int]], params: BeamSearchParams,
                 eos_token_ids: Sequence[int], max_model_len: int, keep_eos: bool = True):
        for prompt in prompts:
            if not 0 < len(prompt) < max_model_len:
                raise InvalidRequestError(f"a prompt of {len(prompt)} tokens leaves no room under "
                                          f"max_model_len {max_model_len}")
        self.params = params
        self.eos = frozenset(() if params.ignore_eos else eos_token_ids)
        self.max_model_len = max_model_len
        self.keep_eos = keep_eos
        self.step_params = SamplingParams(max_tokens=1, logprobs=2 * params.beam_width,
                                          temperature=params.temperature, ignore_eos=True)
        self.live = [[BeamSearchSequence(list(p))] for p in prompts]
        self.done: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        self.steps_left = params.max_tokens
        self._running: list[tuple[int, BeamSearchSequence]] = []

    def requests(self) -> list[list[int]]:
        """The token ids of this step's requests, one a live beam with room
        left in the context (a beam at the context's end stays as it is);
        none once ``max_tokens`` steps are done or no beam can grow."""
        self._running = [] if self.steps_left <= 0 else [
            (i, b) for i, beams in enumerate(self.live) for b in beams
            if len(b.tokens) < self.max_model_len]
        return [b.tokens for _, b in self._running]

    def request_prompts(self) -> list[int]:
        """The prompt index of each request of the last ``requests``, in its order."""
        return [i for i, _ in self._running]

    def advance(self, candidates: Sequence[TokenLogprobs]) -> None:
        """The step's candidates (token id -> ``Logprob``), one mapping a
        request of ``requests``, in its order."""
        if len(candidates) != len(self._running):
            raise ValueError(f"{len(candidates)} candidate sets for {len(self._running)} beams")
        grown: list[list[BeamSearchSequence]] = [
            [b for b in beams if len(b.tokens) >= self.max_model_len] for beams in self.live]
        for (i, beam), tokens in zip(self._running, candidates):
            for token, logprob in tokens.items():
                cum = beam.cum_logprob + logprob.logprob
                if token in self.eos:
                    kept = beam.tokens + [token] if self.keep_eos else beam.tokens
                    self.done[i].append(BeamSearchSequence(
                        kept, beam.logprobs + [tokens], cum, finish_reason="stop",
                        stop_reason=None if self.keep_eos else token))
                else:
                    grown[i].append(BeamSearchSequence(beam.tokens + [token],
                                                       beam.logprobs + [tokens], cum))
        self.live = [self._best(beams) for beams in grown]
        self.steps_left -= 1

    def outputs(self, decode: Callable[[list[int]], str] | None = None
                ) -> list[BeamSearchOutput]:
        """Each prompt's best ``beam_width`` sequences, ended and live
        together, best first, each with its ``text`` where ``decode`` (of
        its tokens) is given."""
        answers = []
        for finished, beams in zip(self.done, self.live):
            for beam in beams:
                beam.finish_reason = "length"
            sequences = self._best(finished + beams)
            for sequence in sequences if decode is not None else ():
                sequence.text = decode(sequence.tokens)
            answers.append(BeamSearchOutput(sequences))
        return answers

    def _best(self, beams: list[BeamSearchSequence]) -> list[BeamSearchSequence]:
        ranked = sorted(beams, key=lambda b: score(b, self.eos, self.params.length_penalty),
                        reverse=True)
        return ranked[:self.params.beam_width]
