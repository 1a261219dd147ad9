"""Per-request sampling parameters, with vLLM's names.

``SamplingParams`` is ``ipc.messages.SamplingOptions`` (the fields the
runner needs, with their defaults and ranges) plus the fields only the
engine reads (``max_tokens``, ``stop_token_ids``, ``ignore_eos``) and those
the caller's side applies (``n`` and ``stop``: ``LLM`` and the HTTP server
run ``n`` engine requests, ``choices``, and cut each one's text at its stop
strings, with them where ``include_stop_str_in_output``; the engine reads
neither, and its endpoint takes only ``n`` 1 and no ``stop``).
``truncate_prompt_tokens`` k keeps a prompt's last k tokens, -1 its last
``max_model_len``, more than ``max_model_len`` is refused (``truncated_prompt``,
where the request enters the engine);
``skip_special_tokens`` False shows special tokens' text in the output
(the detokenizers of ``LLM`` and of the engine's endpoint), and then
``spaces_between_special_tokens`` False (vLLM's; default True) writes each
added token that follows another added token as its bare text, without
the space a decoder may put before it (``checkpoint.tokenizer``); ``detokenize``
False (vLLM's) runs no detokenizer for the request: its output has token
ids, an empty text and logprobs whose ``decoded_token`` is None, and stop
strings, which read the text, are refused with it.
``bad_words`` (vLLM's) are words the output must not complete; the engine
tokenizes them where the request enters it (``LLMEngine.new_request``,
``engine.bad_words``) into the runner's ``bad_words_token_ids``, which it
then sets (replacing any given; without ``bad_words`` a given
``bad_words_token_ids`` is used as it is). ``thinking_token_budget``
(vLLM's) caps each thinking section's tokens under the engine's
reasoning parser, then forces its end (``engine.thinking_budget``):
None (or -1, vLLM's spelling of it) for no cap, else an int >= 0; the
engine refuses it without a reasoning parser. Adding a
field: a runner field goes into ``SamplingOptions`` (with its range in
``problems``), an engine-only one below; both then reach ``LLM``, the HTTP
server (``serving/http/sampling.py`` passes fields by name) and, for runner
fields, the wire (``to_options``) with no other change.

Fields may be assigned after construction, as vLLM scripts do
(``params = llm.get_default_sampling_params(); params.max_tokens = 64``).
The invariants below hold once constructed and in every copy ``checked``
makes (``__post_init__`` raises ``InvalidRequestError``, a ``ValueError``,
otherwise: a bad value is the caller's error, HTTP 400 in the server). The entry
points that take a caller's object (``LLM``'s calls,
``LLMEngine.add_request``, ``EngineClient.generate``) make one such copy,
once, and hand the engine only it (``LLMEngine.new_request`` takes
parameters no caller holds and does not check them again; those the engine
endpoint builds from a message are checked by their constructor), so an
assignment is checked before any of it is used and a caller's later
assignments never reach a request already made. The invariants: every
field has its type (numbers are numbers, not NaN; ints are ints, not
bools, and fit a signed 64-bit integer, the type the messages carry) and
is in its range (``SamplingOptions.problems``; ``max_tokens`` None or
``>= 1``; ``n`` in [1, MAX_N]; ``stop_token_ids`` non-negative; stop
strings not empty, at most ``MAX_STOP_STRINGS``; ``logit_bias`` a dict of
int ids to numbers and ``allowed_token_ids`` a list of ints, ``bad_words`` a list of strings and
``bad_words_token_ids`` a list of lists of ints, each within its bounds).
``temperature`` 0 is greedy, and one in (0, ``MIN_TEMPERATURE``) is stored
as ``MIN_TEMPERATURE`` (vLLM's 0.01), with one warning in the log; greedy
takes ``n`` 1 only (vLLM's rule: its choices could not differ; the error
names ``n``).
``top_k == -1`` is stored as 0, ``stop_token_ids`` and ``stop`` as tuples
(one string as a tuple of one; None, as vLLM takes it, as none); ``seed``
-1 is None (no seed), as vLLM reads it. ``max_tokens`` None: as many as the
context leaves after the prompt (``LLMEngine.new_request`` sets the
number). ``structured_outputs`` (engine only: the workers get the
grammar's bitmask, not the constraint) is None or a
``StructuredOutputsParams`` (a dict is converted; its own checks apply).
``logprob_token_ids`` (vLLM's; a runner field): each sampled token's
logprobs are those of these ids, in place of its top ones
(``num_logprobs``); at most ``MAX_LOGPROB_TOKEN_IDS`` (128, not
``max_logprobs``), ``logprobs`` None or
their number, ids inside the vocabulary (``engine.request.check_request``).
``repetition_detection`` (vLLM's; engine only: the scheduler ends an
output that repeats, ``engine.repetition``) is None or a
``RepetitionDetectionParams`` (a dict is converted; its own checks apply).
``output_kind`` (vLLM's ``RequestOutputKind``; read by no engine, only by a
streaming caller, ``serving.async_llm.AsyncLLM``) is what each of a
request's streamed outputs holds: everything so far, only what is new, or
nothing until the one final output; a member or its value (0, 1, 2: the
wire carries the value), stored as the member. ``LLM.generate`` and
``EngineClient.generate`` return final outputs whatever it says, as vLLM's
``LLM`` does; the HTTP server streams as its own request says.
"""

from __future__ import annotations

import enum
import logging
import math
from typing import Any

import msgspec

from engine.repetition import RepetitionDetectionParams
from engine.stop_strings import MAX_STOP_STRINGS
from engine.structured_outputs.params import StructuredOutputsParams
from ipc.errors import InvalidRequestError
from ipc.messages import MAX_LOGPROB_TOKEN_IDS, SamplingOptions

logger = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_N = 128  # output sequences a request may ask for
# The lowest temperature sampled at (vLLM's): one above 0 but below it is
# raised to it, since dividing logits by it can overflow to inf or NaN.
MIN_TEMPERATURE = 0.01
_NUMBERS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
            "frequency_penalty")


class RequestOutputKind(enum.Enum):
    """vLLM's: what each output a streaming caller gets of a request holds."""

    CUMULATIVE = 0  # the whole output so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, once the request has finished


def _is_int(value: Any) -> bool:
    """An int (not a bool) that fits a signed 64-bit integer."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and _INT64_MIN <= value <= _INT64_MAX)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not (
        isinstance(value, float) and math.isnan(value))


class SamplingParams(SamplingOptions, frozen=False, kw_only=True):
    """How to sample one request's tokens and when to stop."""

    n: int = 1
    max_tokens: int | None = 16
    stop: tuple[str, ...] | list[str] | str | None = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    truncate_prompt_tokens: int | None = None
    stop_token_ids: tuple[int, ...] | list[int] | None = ()
    ignore_eos: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    bad_words: list[str] | None = None
    thinking_token_budget: int | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        # vLLM's spellings: None for no stop strings or ids, seed -1 and
        # thinking_token_budget -1 for none.
        for name in ("stop", "stop_token_ids"):
            if getattr(self, name) is None:
                msgspec.structs.force_setattr(self, name, ())
        if self.seed == -1 and not isinstance(self.seed, bool):
            msgspec.structs.force_setattr(self, "seed", None)
        if _is_int(self.thinking_token_budget) and self.thinking_token_budget == -1:
            msgspec.structs.force_setattr(self, "thinking_token_budget", None)
        self._check_structured_outputs()
        if self.repetition_detection is not None:
            msgspec.structs.force_setattr(self, "repetition_detection",
                                          RepetitionDetectionParams.from_value(
                                              self.repetition_detection))
        self._check_types()
        self._check_output_kind()
        self._raise_tiny_temperature()
        if self.top_k == -1:
            msgspec.structs.force_setattr(self, "top_k", 0)
        msgspec.structs.force_setattr(self, "stop_token_ids", tuple(self.stop_token_ids))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        msgspec.structs.force_setattr(self, "stop", stop)
        problems = self.problems()
        if problems:
            raise InvalidRequestError(problems[0])
        if self.temperature == 0 and self.n > 1:
            raise InvalidRequestError(
                f"n must be 1 when sampling greedily (temperature 0), got {self.n}: greedy "
                "choices are all the same; give a temperature above 0 for different ones",
                param="n")

    def _check_types(self) -> None:
        for name in _NUMBERS:
            if not _is_number(getattr(self, name)):
                raise InvalidRequestError(f"{name} must be a number, got {getattr(self, name)!r}")
        if not _is_int(self.top_k):
            raise InvalidRequestError(f"top_k must be a 64-bit int, got {self.top_k!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise InvalidRequestError(f"seed must be None or a 64-bit int, got {self.seed!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise InvalidRequestError(
                f"max_tokens must be an int >= 1 (or None), got {self.max_tokens!r}")
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise InvalidRequestError(f"n must be in [1, {MAX_N}], got {self.n!r}")
        self._check_stop()
        self._check_token_lists()
        if isinstance(self.stop_token_ids, (str, bytes)):
            raise InvalidRequestError("stop_token_ids must be a list of ints, got a string")
        try:
            stop_ids = list(self.stop_token_ids)
        except TypeError:
            raise InvalidRequestError(
                f"stop_token_ids must be a list of ints, got {self.stop_token_ids!r}"
            ) from None
        bad = [t for t in stop_ids if not _is_int(t) or t < 0]
        if bad:
            raise InvalidRequestError(f"stop_token_ids must be non-negative ints, got {bad!r}")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                     "spaces_between_special_tokens", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.stop and not self.detokenize:
            raise InvalidRequestError("stop strings need the output's text: give detokenize=True, "
                                      "or end the output with stop_token_ids")
        k = self.truncate_prompt_tokens
        if k is not None and (not _is_int(k) or (k < 1 and k != -1)):
            raise InvalidRequestError("truncate_prompt_tokens must be None, an int >= 1 or -1 "
                                      f"(max_model_len), got {k!r}")
        if self.logprobs is not None and not _is_int(self.logprobs):
            raise InvalidRequestError(
                f"logprobs must be None, an int >= 0 or -1 (the whole vocabulary), "
                f"got {self.logprobs!r}")
        if self.prompt_logprobs is not None and not _is_int(self.prompt_logprobs):
            raise InvalidRequestError(
                f"prompt_logprobs must be None, an int >= 0 or -1 (the whole vocabulary), "
                f"got {self.prompt_logprobs!r}")
        budget = self.thinking_token_budget
        if budget is not None and (not _is_int(budget) or budget < 0):
            raise InvalidRequestError(
                f"thinking_token_budget must be an int >= 0, or -1 (or None) for no limit, "
                f"got {budget!r}", param="thinking_token_budget")
        if not _is_int(self.min_tokens) or (self.max_tokens is not None
                                            and self.min_tokens > self.max_tokens):
            raise InvalidRequestError(
                f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], "
                f"got {self.min_tokens!r}")

    def _check_output_kind(self) -> None:
        """A ``RequestOutputKind``, or its value (what the wire carries)."""
        kind = self.output_kind
        if isinstance(kind, RequestOutputKind):
            return
        if _is_int(kind) and kind in {k.value for k in RequestOutputKind}:
            msgspec.structs.force_setattr(self, "output_kind", RequestOutputKind(kind))
            return
        raise InvalidRequestError(
            f"output_kind must be a RequestOutputKind (CUMULATIVE, DELTA, FINAL_ONLY) or its "
            f"value 0, 1 or 2, got {kind!r}", param="output_kind")

    def _raise_tiny_temperature(self) -> None:
        """vLLM's rule: 0 stays greedy; a temperature in (0, MIN_TEMPERATURE)
        is raised to MIN_TEMPERATURE, with a warning. Said once for these
        parameters: their copies (``checked``, ``choices``) carry the raised
        value and say nothing."""
        if 0 < self.temperature < MIN_TEMPERATURE:
            logger.warning("temperature %s is below %s, where dividing the logits by it may "
                           "overflow; sampling at %s instead (as vLLM does)", self.temperature,
                           MIN_TEMPERATURE, MIN_TEMPERATURE)
            msgspec.structs.force_setattr(self, "temperature", MIN_TEMPERATURE)

    def _check_token_lists(self) -> None:
        bias = self.logit_bias
        if bias is not None and not (isinstance(bias, dict) and all(
                _is_int(t) and _is_number(b) for t, b in bias.items())):
            raise InvalidRequestError(
                f"logit_bias must map token ids (ints) to numbers, got {bias!r}")
        if bias is not None:
            msgspec.structs.force_setattr(self, "logit_bias", dict(bias))
        allowed = self.allowed_token_ids
        if allowed is not None and not (isinstance(allowed, (list, tuple))
                                        and all(_is_int(t) for t in allowed)):
            raise InvalidRequestError(f"allowed_token_ids must be a list of ints, got {allowed!r}")
        if allowed is not None:
            msgspec.structs.force_setattr(self, "allowed_token_ids", list(allowed))
        words = self.bad_words
        if words is not None and not (isinstance(words, (list, tuple))
                                      and all(isinstance(w, str) for w in words)):
            raise InvalidRequestError(f"bad_words must be a list of strings, got {words!r}")
        if words is not None:
            msgspec.structs.force_setattr(self, "bad_words", list(words))
        sequences = self.bad_words_token_ids
        if sequences is not None and not (
                isinstance(sequences, (list, tuple))
                and all(isinstance(seq, (list, tuple)) and all(_is_int(t) for t in seq)
                        for seq in sequences)):
            raise InvalidRequestError(
                f"bad_words_token_ids must be a list of lists of ints, got {sequences!r}")
        if sequences is not None:
            msgspec.structs.force_setattr(self, "bad_words_token_ids",
                                          [list(seq) for seq in sequences])
        self._check_logprob_token_ids()

    def _check_logprob_token_ids(self) -> None:
        """vLLM's rules: at most MAX_LOGPROB_TOKEN_IDS ids, whatever the
        engine's ``max_logprobs`` (which holds ``logprobs`` and
        ``prompt_logprobs``, not this list), none negative
        (the engine checks the vocabulary's end), ``logprobs`` None or their
        number; an empty list asks for nothing (None)."""
        ids = self.logprob_token_ids
        if ids is None:
            return
        if not (isinstance(ids, (list, tuple)) and all(_is_int(t) for t in ids)):
            raise InvalidRequestError(f"logprob_token_ids must be a list of ints, got {ids!r}",
                                      param="logprob_token_ids")
        msgspec.structs.force_setattr(self, "logprob_token_ids", list(ids) or None)
        if len(ids) > MAX_LOGPROB_TOKEN_IDS:
            raise InvalidRequestError(
                f"logprob_token_ids holds {len(ids)} ids, more than the {MAX_LOGPROB_TOKEN_IDS} "
                f"allowed (a fixed limit; max_logprobs, --max-logprobs, does not apply to "
                f"the list)", param="logprob_token_ids")
        if any(t < 0 for t in ids):
            raise InvalidRequestError(
                f"logprob_token_ids must be token ids >= 0, got {[t for t in ids if t < 0]}",
                param="logprob_token_ids")
        if ids and self.logprobs is not None and self.logprobs != len(ids):
            raise InvalidRequestError(
                f"with logprob_token_ids, logprobs must be None or their number {len(ids)}, "
                f"got {self.logprobs}", param="logprob_token_ids")

    @property
    def num_logprobs(self) -> int | None:
        """The logprobs each sampled token reports (vLLM's): ``logprobs``,
        else the number of ``logprob_token_ids``, else None (none)."""
        if self.logprobs is not None:
            return self.logprobs
        return len(self.logprob_token_ids) if self.logprob_token_ids else None

    def _check_stop(self) -> None:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise InvalidRequestError(
                f"stop must be a string or a list of strings, got {self.stop!r}")
        if not all(stop):
            raise InvalidRequestError("a stop string must not be empty")
        if len(stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"stop holds {len(stop)} strings, more than {MAX_STOP_STRINGS}")

    def _check_structured_outputs(self) -> None:
        so = self.structured_outputs
        if isinstance(so, dict):
            msgspec.structs.force_setattr(self, "structured_outputs",
                                          StructuredOutputsParams.from_dict(so))
        elif so is not None and not isinstance(so, StructuredOutputsParams):
            raise InvalidRequestError(
                "structured_outputs must be a StructuredOutputsParams or a dict, "
                f"got {type(so).__name__}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        """Build from a plain mapping; unknown keys raise
        ``InvalidRequestError`` naming them (rather than the constructor's
        ``TypeError``)."""
        known = set(cls.__struct_fields__)
        unknown = sorted(str(k) for k in d if k not in known)  # keys of any type
        if unknown:
            raise InvalidRequestError(
                f"unknown sampling parameter(s): {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (what ``from_dict`` takes back), as plain data."""
        out = msgspec.structs.asdict(self)
        out["output_kind"] = self.output_kind.value
        if self.structured_outputs is not None:
            out["structured_outputs"] = self.structured_outputs.to_dict()
        if self.repetition_detection is not None:
            out["repetition_detection"] = self.repetition_detection.to_dict()
        return out

    def choices(self) -> list[SamplingParams]:
        """The ``n`` engine requests of these parameters, each with ``n`` 1:
        with a ``seed``, choice i samples with seed + i (wrapped into the
        64-bit range), so the choices differ yet the whole answer is
        reproducible; without one, each draws its own. With ``n`` 1: these
        parameters themselves (nothing to copy or check again)."""
        if self.n == 1:
            return [self]
        fields = self.to_dict()
        fields["n"] = 1
        return [SamplingParams.from_dict(dict(fields, seed=_choice_seed(self.seed, i)))
                for i in range(self.n)]

    def checked(self) -> SamplingParams:
        """A copy with every invariant checked again and the spellings
        normalized (``InvalidRequestError`` as the constructor's): what a field
        assigned since construction is checked by."""
        return msgspec.structs.replace(self)

    def replaced(self, **fields) -> SamplingParams:
        """These parameters with ``fields`` set (checked again)."""
        return SamplingParams.from_dict(dict(self.to_dict(), **fields))

    def fitted_to(self, room: int) -> SamplingParams:
        """These parameters with ``max_tokens`` (None: unbounded) and
        ``min_tokens`` at most ``room``, the tokens a context leaves."""
        max_tokens = room if self.max_tokens is None else min(self.max_tokens, room)
        if max_tokens == self.max_tokens and self.min_tokens <= max_tokens:
            return self
        return self.replaced(max_tokens=max_tokens, min_tokens=min(self.min_tokens, max_tokens))

    def to_options(self) -> SamplingOptions:
        """The fields the runner needs, as the IPC message (numbers as
        their wire types)."""
        return msgspec.convert({f: getattr(self, f) for f in SamplingOptions.__struct_fields__},
                               SamplingOptions)


def _choice_seed(seed: int | None, choice: int) -> int | None:
    """seed + choice, wrapped into the signed 64-bit range seeds live in;
    -1, which means no seed, is taken by the range's minimum (which seed +
    0..MAX_N-1 can only reach where it does not pass -1)."""
    if seed is None:
        return None
    derived = (seed + choice - _INT64_MIN) % (1 << 64) + _INT64_MIN
    return _INT64_MIN if derived == -1 else derived


def truncated_prompt(prompt_token_ids: list[int], k: int | None,
                     max_model_len: int, side: str | None = None) -> list[int]:
    """The prompt's last k tokens (``truncate_prompt_tokens``, vLLM's rule:
    -1 is ``max_model_len``), or its first k where ``side`` is "right"
    (vLLM's HTTP field ``truncation_side``: the side cut off), or the whole
    prompt where k is None. The one home of the rule, for the engine
    (``LLMEngine.new_request``, which keeps the last) and the HTTP routes
    that truncate before it (whose first k the engine then keeps whole): a
    k above ``max_model_len`` is refused (an ``InvalidRequestError`` naming
    the field), whatever the prompt's length, as vLLM refuses it."""
    if k is None:
        return prompt_token_ids
    if k > max_model_len:
        raise InvalidRequestError(
            f"truncate_prompt_tokens {k} is more than max_model_len {max_model_len}, the "
            f"longest prompt this model takes; ask for at most {max_model_len} (-1 keeps "
            "max_model_len tokens)", param="truncate_prompt_tokens")
    kept = max_model_len if k == -1 else k
    return prompt_token_ids[:kept] if side == "right" else prompt_token_ids[-kept:]
