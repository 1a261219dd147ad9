"""One generation request as the scheduler tracks it.

Invariants: ``all_token_ids == prompt_token_ids + output_token_ids``;
``0 <= num_computed_tokens <= num_tokens`` (tokens whose KV is written or
scheduled to be written); a finished request never changes again.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass

from engine.repetition import RepetitionDetector
from engine.sampling_params import SamplingParams
from engine.structured_outputs.grammar import Grammar
from engine.thinking_budget import ThinkingBudget
from ipc.config import TOKEN_POOLING_TASKS, SchedulerConfig
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",  # the grammar refused the sampled token
    RequestStatus.FINISHED_REPETITION: "repetition",  # engine.repetition
}


def _eos_set(eos_token_id: int | Iterable[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset((eos_token_id,))
    return frozenset(int(t) for t in eos_token_id)


class Request:
    """A prompt, its sampling parameters and what has been generated so far.

    End-of-sequence ids, vLLM's rule: ``eos_token_id`` is the main one (the
    tokenizer's; one id, a set of ids or None; ``eos_token_ids`` is always
    the frozenset form), which ends the request with ``stop_reason`` None
    unless ``ignore_eos``. ``secondary_eos_token_ids`` are the model's
    other end ids (generation_config.json's beyond the main one): unless
    ``ignore_eos`` they join the request's ``stop_token_ids`` (the
    parameters' own plus these), so one that ends the request is its
    ``stop_reason``, as a stop token id is. ``min_tokens`` holds back
    ``all_stop_token_ids``, every one of them, with ``ignore_eos`` too.
    ``num_output_placeholders`` counts tokens sampled on the device but not
    yet appended (async scheduling); it is 0 when scheduling is synchronous.
    ``grammar`` is the request's structured-output matcher (None when
    unconstrained); it has consumed exactly ``output_token_ids``.
    ``next_drafts``: with a grammar and speculative decoding, the drafts the
    runner proposed after the last step that sampled for it (from that
    step's output), which its next step verifies the first of.
    ``cache_salt`` (vLLM's; None or a non-empty string) keys its prefix-cache
    blocks apart from those of every other salt and of no salt
    (``KVCacheManager``). ``prompt_logprob_width``: the entries each of its
    scored prompt positions sends (``prompt_logprobs.entries_per_position``;
    0 without prompt logprobs), which the scheduler holds each step to.
    ``starts_in_reasoning``: under the engine's reasoning parser, its output
    begins inside its reasoning (the engine's one decision of it,
    ``LLMEngine.new_request``). ``thinking_budget``: its
    ``thinking_token_budget`` as the engine holds it (None: no budget, or no
    reasoning to spend it on); every appended token goes through it.
    ``repetition``: its ``repetition_detection`` check (None where it asks
    for none), fed every appended token, so that the scheduler reads its
    verdict (``repeating``) without a pass over the output.
    ``lora_request``: the LoRA adapter it runs with (None: the base model),
    checked where it entered the engine (``engine.lora_checks``); its name
    keys its prefix-cache blocks as a salt does (``KVCacheManager``).
    """

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | Iterable[int] | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        secondary_eos_token_ids: Iterable[int] = (),
        cache_salt: str | None = None,
        prompt_logprob_width: int = 0,
        starts_in_reasoning: bool = False,
        lora_request: LoRARequest | None = None,
    ) -> None:
        self.req_id = req_id
        self.cache_salt = cache_salt
        self.lora_request = lora_request
        self.starts_in_reasoning = starts_in_reasoning
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.eos_token_ids = _eos_set(eos_token_id)
        secondary = frozenset(secondary_eos_token_ids) - self.eos_token_ids
        self.stop_token_ids = frozenset(sampling_params.stop_token_ids) | (
            frozenset() if sampling_params.ignore_eos else secondary)
        self.all_stop_token_ids = (frozenset(sampling_params.stop_token_ids)
                                   | self.eos_token_ids | secondary)
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority
        self.output_token_ids: list[int] = []
        self._all_token_ids = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.grammar: Grammar | None = None
        self.next_drafts: list[int] = []
        self.thinking_budget: ThinkingBudget | None = None
        detection = sampling_params.repetition_detection
        self.repetition = (RepetitionDetector(detection)
                           if detection is not None and detection.enabled else None)
        self.num_cached_tokens: int | None = None  # prefix-cache hits at first scheduling
        # time.monotonic() when the scheduler queued it and first scheduled it
        # (a preemption leaves it): RequestOutput.metrics' queued_ts and scheduled_ts.
        self.queued_ts: float | None = None
        self.scheduled_ts: float | None = None
        self.prompt_logprobs: list | None = None  # engine.prompt_logprobs fills it
        self.prompt_logprob_width = prompt_logprob_width
        self.prompt_logprobs_sent = False
        # A pooling request's resolved parameters (None: it generates);
        # ``LLMEngine.new_pooling_request`` sets them.
        self.pooling_params = None
        # A token-level pooling request's rows of the chunks run so far (the
        # scheduler's; a preemption empties it, as its prompt runs again).
        self.pooled_chunks: list[bytes] = []

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by output (a view: do not mutate)."""
        return self._all_token_ids

    @property
    def pooling_task(self) -> str | None:
        """A pooling request's task (None: it generates)."""
        return None if self.pooling_params is None else self.pooling_params.task

    @property
    def pools_tokens(self) -> bool:
        """Whether it answers one row per prompt token (a token-level task)."""
        return self.pooling_task in TOKEN_POOLING_TASKS

    @property
    def reads_prefix_cache(self) -> bool:
        """Whether it may take prefix-cache hits: not where every prompt
        position must run (prompt logprobs need each one's logits, a
        token-level pooling request each one's hidden state), as vLLM
        skips reading the cache for both."""
        return self.sampling_params.prompt_logprobs is None and not self.pools_tokens

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def max_tokens(self) -> int:
        return self.sampling_params.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        """One of "stop", "length", "abort", "error", "repetition"; None
        while unfinished."""
        return _FINISH_REASONS.get(self.status)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)
        if self.thinking_budget is not None:
            self.thinking_budget.accept(token_id)
        if self.repetition is not None:
            self.repetition.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.req_id!r}, status={self.status.name}, "
            f"prompt={self.num_prompt_tokens}, output={len(self.output_token_ids)}, "
            f"computed={self.num_computed_tokens})"
        )


class ContextLengthError(InvalidRequestError):
    """The prompt, or the prompt plus ``max_tokens``, does not fit the model's
    context (``max_model_len``). ``code`` is OpenAI's name for the error,
    which clients look for to shorten a conversation; ``param`` the field it
    blames, in the caller's names (``ContextFields``)."""

    code = "context_length_exceeded"

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message, param=param)


@dataclass(frozen=True)
class ContextFields:
    """What an API calls the two sides of the context rule, so that the
    error names the fields its client sent: the prompt's and the output
    bound's. The engine's own: ``ENGINE_FIELDS``."""

    prompt: str
    max_tokens: str


ENGINE_FIELDS = ContextFields(prompt="prompt", max_tokens="max_tokens")


def check_context_length(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int,
                         fields: ContextFields = ENGINE_FIELDS,
                         shown_max_tokens: int | None = None) -> None:
    """The context rule, owned here for every caller: prompt + ``max_tokens``
    within ``max_model_len``; ``max_tokens`` None checks the prompt alone,
    which must leave room for one token. ``ContextLengthError`` names
    ``fields`` and shows ``shown_max_tokens`` (default: ``max_tokens``),
    the value the client gave where the engine runs a capped one."""
    n = num_prompt_tokens
    if max_tokens is None:
        if n >= max_model_len:
            raise ContextLengthError(
                f"the {fields.prompt} ({n} tokens) leaves no room for output in "
                f"max_model_len {max_model_len}, this model's maximum context length",
                fields.prompt)
        return
    if n + max_tokens > max_model_len:
        shown = max_tokens if shown_max_tokens is None else shown_max_tokens
        raise ContextLengthError(
            f"{fields.prompt} ({n} tokens) + {fields.max_tokens} ({shown}) = {n + shown} "
            f"exceeds max_model_len {max_model_len}, this model's maximum context length",
            fields.max_tokens)


class LogprobsLimitError(InvalidRequestError):
    """More top logprobs per token than ``max_logprobs`` allows; ``param``
    the field that asked, in the caller's names."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message, param=param)


def check_logprobs_limit(asked: int | None, max_logprobs: int, name: str,
                         vocab_size: int | None = None) -> None:
    """The rule on top logprobs per token, vLLM's: -1 asks for the whole
    vocabulary (``vocab_size`` entries), and at most ``max_logprobs`` may be
    asked, -1 meaning the whole vocabulary too (so no cap). A -1 request
    under a cap is refused unless the vocabulary fits in it; with the
    vocabulary unknown (``vocab_size`` None) it is assumed not to.
    ``name`` is the field that asked ``asked`` (None: nothing), as the
    caller's user wrote it: the engine's ``logprobs`` and
    ``prompt_logprobs``, or an HTTP route's own field (the chat's
    ``top_logprobs``), so the error names what was sent."""
    if asked is None or max_logprobs == -1:
        return
    if asked == -1:
        if vocab_size is None or vocab_size > max_logprobs:
            size = "" if vocab_size is None else f", {vocab_size} tokens"
            raise LogprobsLimitError(
                f"{name} -1 (the whole vocabulary{size}) is more than max_logprobs "
                f"{max_logprobs}; start the engine with max_logprobs -1 (--max-logprobs -1) "
                "to allow it", name)
    elif asked > max_logprobs:
        raise LogprobsLimitError(f"{name} {asked} is more than max_logprobs {max_logprobs}",
                                 name)


def check_request(prompt_token_ids: list[int], params: SamplingParams, limits: SchedulerConfig,
                  vocab_size: int | None = None) -> None:
    """The one place that decides whether a request can run, called once,
    where the request enters the engine (``LLMEngine.new_request``);
    ``InvalidRequestError`` names the first rule it breaks, and nothing has
    changed.

    Rules: a non-empty prompt; ids inside ``[0, vocab_size)`` (when given);
    prompt + ``max_tokens`` within ``max_model_len`` (``check_context_length``);
    enough KV blocks in the whole cache for the longest it may grow; at most
    ``max_logprobs`` top logprobs per token (sampled or prompt; -1 is the
    whole vocabulary, ``check_logprobs_limit``); ``logit_bias``,
    ``allowed_token_ids``, ``bad_words_token_ids`` and ``logprob_token_ids``
    inside the vocabulary (when given).
    """
    n, max_tokens = len(prompt_token_ids), params.max_tokens
    if not n:
        raise InvalidRequestError("the prompt is empty")
    if vocab_size is not None:
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    check_context_length(n, max_tokens, limits.max_model_len)
    blocks = -(-(n + max_tokens - 1) // limits.block_size)
    if blocks > limits.num_blocks:
        raise InvalidRequestError(
            f"prompt ({n} tokens) + max_tokens ({max_tokens}) may need {blocks} KV blocks of "
            f"{limits.block_size} tokens, but the cache has only {limits.num_blocks}; lower "
            "max_tokens or give the cache more blocks")
    for name in ("logprobs", "prompt_logprobs"):
        check_logprobs_limit(getattr(params, name), limits.max_logprobs, name, vocab_size)
    if vocab_size is not None:
        bad_words_ids = [t for s in params.bad_words_token_ids or () for t in s]
        for name, ids in (("logit_bias", params.logit_bias or ()),
                          ("allowed_token_ids", params.allowed_token_ids or ()),
                          ("bad_words_token_ids", bad_words_ids),
                          ("logprob_token_ids", params.logprob_token_ids or ())):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise InvalidRequestError(f"{name} token ids {bad[:5]} are outside the "
                                          f"vocabulary [0, {vocab_size})", param=name)
