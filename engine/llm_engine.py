"""The engine: scheduler + KV block pool + an executor, one step at a time.

One step (``step``): schedule, send the plan to the workers, wait for the
output rank's reply, append tokens, check stops. With async scheduling the
engine sends the next step before it waits for the previous one's reply
(see ``step``). Requests are validated before anything is scheduled; an
invalid one raises ``InvalidRequestError`` (a ``ValueError``) and leaves the
engine as it was (a structured-output constraint is compiled then: one that
does not compile in time is invalid). Any other exception from making a
request is the engine's own failure, not the request's.

A step with constrained requests is two messages: the plan, then its
grammar bitmask (``executor.sample_tokens``), computed once the grammars
have absorbed every token before the step. With async scheduling the fill
is off the loop's path (``step``): the fill of step N+1 starts in the
background as soon as step N is absorbed; the loop returns N's deltas,
schedules and sends step N+2's plan, and only then sends N+1's bitmask, so
the fill overlaps the caller's work, the scheduling of N+2 and N+1's
forward pass; the workers keep N+2's plan until N+1 has sampled
(``worker.step_order``). Steps without constrained requests send one
message and never wait for a fill.
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from checkpoint.description import describe
from checkpoint.generation_config import eos_token_ids, sampling_defaults
from checkpoint.resolve import resolve_model_dir
from checkpoint.tokenizer import Tokenizer
from engine.bad_words import bad_words_token_ids
from engine.classify_head import resolved_classify_params
from engine.config import AUTO_MAX_MODEL_LEN, ConfigError, EngineConfig
from engine.lora_checks import LoRAChecks
from engine.outputs import RequestOutputDelta
from engine.pooler_config import TASK_NAMES
from engine.pooling_params import (
    Matryoshka,
    PoolingParams,
    check_pooling_prompt,
    resolved_params,
)
from engine.pooling_tasks import check_pooled_rows, is_token_task, supported_tasks
from engine.profiler_config import PROFILING_OFF
from engine.prompt_logprobs import entries_per_position
from engine.reasoning import Reasoning
from engine.request import Request, check_context_length, check_request
from engine.sampling_params import SamplingParams, truncated_prompt
from engine.scheduler import Scheduler
from engine.stats import StatsLogger, StepCounters, snapshot
from engine.structured_outputs import StructuredOutputManager
from engine.structured_outputs.manager import PendingBitmask
from engine.thinking_budget import ThinkingBudget, check_budget_has_parser
from executor.base import Executor, OutputFuture, WorkerFailure
from ipc import trace
from ipc.config import SLEEP_LEVELS, SLEEP_TAGS
from ipc.engine_messages import EngineStats
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest
from ipc.messages import ModelRunnerOutput, SchedulerOutput
from ipc.model_config import ModelConfig
from ipc.weight_files import check_weight_files

logger = logging.getLogger(__name__)


def make_executor(config: EngineConfig, device: str) -> Executor:
    if config.resolved_executor == "uni":
        from executor.uniproc import UniprocExecutor

        return UniprocExecutor(device)
    from executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(config.tensor_parallel_size, device, config.master_addr,
                             config.master_port, step_timeout_s=config.step_timeout_s,
                             attach_dir=config.attach_workers_dir)


@dataclass(frozen=True)
class _Settled:
    """The output of a step that never left the engine."""

    output: ModelRunnerOutput

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        return self.output


@dataclass(frozen=True)
class _SentStep:
    """A step sent to the workers whose output is not absorbed yet."""

    plan: SchedulerOutput
    future: OutputFuture


class LLMEngine:
    def __init__(self, config: EngineConfig):
        """Checks every rule of the model and the machine (``EngineConfig``)
        before the executor starts a worker."""
        self.config = config
        try:
            self.model_dir = resolve_model_dir(config.model)
            self.model_config = describe(self.model_dir)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        config.check_model(self.model_config)
        config.check_machine()
        try:  # the model's files beyond its description: read or checked here, once
            if config.load_format != "dummy":
                pooler = config.pooler_for(self.model_config)
                check_weight_files(self.model_dir, self.model_config,
                                   classify=pooler is not None and pooler.task == "classify")
            self.tokenizer = Tokenizer.from_dir(self.model_dir)
            # The reasoning parser, its tags as this tokenizer holds them (None: no parser).
            name = config.resolved_reasoning_parser
            self.reasoning = None if name is None else Reasoning.named(name, self.tokenizer)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        # Where a request leaves a sampling field unset (LLM without
        # SamplingParams, the HTTP server): the model's recommendation, or
        # that of the folder generation_config names.
        self.sampling_defaults = {}
        if config.generation_config != "vllm":
            folder = (self.model_dir if config.generation_config == "auto"
                      else config.generation_config)
            try:
                self.sampling_defaults = sampling_defaults(folder)
                # A folder's own end-of-sequence ids end outputs too, as vLLM's
                # (the model's generation_config.json's are in its description).
                extra = eos_token_ids(folder)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            if any(t >= self.model_config.vocab_size for t in extra):
                raise ConfigError(f"{folder}/generation_config.json: eos_token_id {list(extra)} "
                                  f"outside the vocabulary of {self.model_config.vocab_size}")
            if extra:
                self.model_config = msgspec.structs.replace(
                    self.model_config, eos_token_ids=tuple(dict.fromkeys(
                        (*self.model_config.eos_token_ids, *extra))))
            if self.sampling_defaults:
                logger.info("sampling defaults from %s (--generation-config vllm leaves "
                            "them): %s", os.path.join(folder, "generation_config.json"),
                            self.sampling_defaults)
        self.structured_outputs = StructuredOutputManager(
            os.path.join(self.model_dir, "tokenizer.json"), self.model_config.vocab_size,
            list(self.model_config.eos_token_ids),
            reasoning=None if self.reasoning is None else self.reasoning.tokens,
            speculative=config.speculative is not None)
        self.lora_checks = LoRAChecks(config.lora_config, self.model_config)
        self.device = config.resolved_device
        # An embedding engine's pooler (None: it generates) and what the
        # model says of Matryoshka dimensions.
        self.pooler = config.pooler_for(self.model_config)
        self.matryoshka = Matryoshka.of_model_dir(self.model_dir)
        draft_dir, self.draft_model_config = self._draft_model(config)
        runner_config = config.runner_config(self.model_dir, self.model_config, draft_dir,
                                             self.draft_model_config)
        self.executor = make_executor(config, self.device)
        try:  # whatever stops the start from here (a failure, a signal) stops the workers
            self._start_serving(config, runner_config)
        except BaseException:
            self.shutdown()
            raise

    def _start_serving(self, config: EngineConfig, runner_config) -> None:
        """The workers' model and KV cache (checked before it is allocated),
        then the engine's own state."""
        self.num_blocks = self.executor.initialize(runner_config, config.num_gpu_blocks_override,
                                                   check_blocks=self._check_kv_cache)
        self.max_model_len = self._decide_max_model_len(config)
        self.scheduler = Scheduler(config.scheduler_config(self.model_config, self.num_blocks,
                                                           self.draft_model_config))
        self.scheduler.lora_readable = self.lora_checks.readable
        self._say_draft_limit(config)
        self.request_ids = itertools.count()
        self.in_flight: _SentStep | None = None  # async scheduling only
        self.pending_bitmask: PendingBitmask | None = None  # in_flight's, being filled
        # A reply that broke the runner's contract (``_absorb``), said by
        # every later step: the workers' state is no longer the scheduler's.
        self.broken_reply: str | None = None
        self.counters = StepCounters()
        # Sleep mode: the tags of the workers' memory still asleep (empty: awake).
        self.sleeping_tags: set[str] = set()
        self.profiling = False  # the workers' profilers record (start_profile until stop_profile)
        self.stats_logger = None
        if not config.disable_log_stats:
            self.stats_logger = StatsLogger(self.get_stats, self._prefix_counts,
                                            config.log_stats_interval_s)
        logger.info("engine ready: %s, TP=%d on %s, %d KV blocks", self.model_dir,
                    config.tensor_parallel_size, self.device, self.num_blocks)

    def _check_kv_cache(self, num_blocks: int) -> None:
        """A cache of ``num_blocks`` blocks holds a request of the length it
        gives (``EngineConfig.max_model_len_for``, ``check_kv_cache``; none
        at all fails too): ``ConfigError`` otherwise, before it is allocated."""
        length = self.config.max_model_len_for(self.model_config, num_blocks)
        self.config.check_kv_cache(num_blocks, length)

    def _decide_max_model_len(self, config: EngineConfig) -> int:
        """The length every request gets, now that the KV cache is sized and
        checked (``_check_kv_cache``); with ``max_model_len`` -1
        ("auto") said once, with what decided it. The runners keep the
        tables they were built with, sized for the model's positions: the
        decided length is never longer, and only the engine admits
        requests."""
        length = config.max_model_len_for(self.model_config, self.num_blocks)
        if config.max_model_len == AUTO_MAX_MODEL_LEN:
            logger.info("max_model_len auto: %d tokens (the KV cache holds %d: %d blocks of %d; "
                        "the model has %d positions)", length, self.num_blocks * config.block_size,
                        self.num_blocks, config.block_size,
                        self.model_config.max_position_embeddings)
        return length

    def _say_draft_limit(self, config: EngineConfig) -> None:
        """Once, at INFO: a draft model of fewer positions than the length
        requests get drafts only below them (``draft_max_model_len``)."""
        limit = self.scheduler.config.draft_max_model_len
        if self.draft_model_config is None or limit >= self.max_model_len:
            return
        logger.info("draft model %s has %d positions (max_position_embeddings), fewer than "
                    "max_model_len %d: a request drafts while its tokens and drafts stay within "
                    "%d, then decodes without drafts", config.speculative.model, limit,
                    self.max_model_len, limit)

    def _draft_model(self, config: EngineConfig) -> tuple[str | None, ModelConfig | None]:
        """The draft model's directory and description (speculative method
        "draft_model"), checked against the target before any worker starts."""
        spec = config.speculative
        if spec is None or spec.method != "draft_model":
            return None, None
        try:
            draft_dir = resolve_model_dir(spec.model)
            draft = describe(draft_dir)
            check_weight_files(draft_dir, draft)
        except ValueError as e:
            raise ConfigError(f"speculative_config: draft model: {e}") from None
        config.check_draft_model(self.model_config, draft)
        return draft_dir, draft

    # ---- requests ------------------------------------------------------
    def tokenize(self, prompt: str | dict) -> list[int]:
        """The prompt's token ids (an empty text gives none, which
        ``check_request`` refuses). A dict prompt may also hold a
        ``cache_salt`` (``cache_salt_of`` reads it)."""
        keys = set(prompt) - {"cache_salt"} if isinstance(prompt, dict) else None
        if keys == {"prompt"}:
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt) if prompt else []
        if keys == {"prompt_token_ids"}:
            return checked_token_ids(prompt["prompt_token_ids"])
        raise InvalidRequestError(
            "a prompt is a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
            "the dicts with an optional 'cache_salt': str"
        )

    def prompt_token_ids(self, prompt: str | dict, params: SamplingParams) -> list[int]:
        """The token ids a request of ``prompt`` runs on: the prompt
        tokenized, then cut to ``params.truncate_prompt_tokens``
        (``truncated_prompt``). Reads only the tokenizer and the
        configuration, so any thread may call it (``new_request`` does)."""
        return truncated_prompt(self.tokenize(prompt), params.truncate_prompt_tokens,
                                self.scheduler.config.max_model_len)

    def new_request(self, prompt: str | dict, params: SamplingParams,
                    req_id: str | None = None, priority: int = 0,
                    fit_context: bool = False, enable_thinking: bool = True,
                    lora_request: LoRARequest | None = None) -> Request:
        """The request of ``prompt``, tokenized and checked with this engine's
        limits and vocabulary (``check_request``: the one check a request
        gets, here where it enters the engine), with its structured-output
        constraint compiled (waits for the compile, at most its time limit)
        and its own matcher; nothing is queued. It changes no state of the
        engine and reads only its configuration, tokenizer and compiled
        grammars, so it may run on another thread than the engine loop's
        (the serving loop tokenizes text there: ``serving.endpoint``);
        ``enqueue`` runs on the loop's.

        ``params`` become the engine's own: they must be checked and held by
        no caller that may still assign to them (``SamplingParams.checked``'s
        copy of a caller's, as ``LLM`` and ``add_request`` make it once, or
        parameters built from a message, ``choices`` or ``replaced``, which
        their constructor checked). They are used as they are, not checked
        again.

        ``max_tokens`` None means what the context leaves. With
        ``fit_context`` a ``max_tokens`` (and ``min_tokens``) past the
        context is cut to what it leaves, so the request ends there with
        "length" (vLLM's offline ``LLM``); without, such a request is refused
        (vLLM's HTTP server). A prompt that leaves no room for one token is
        refused either way; where ``max_tokens`` is None or cut, the
        refusal blames the prompt (its ``param``), not a number the caller
        did not give. ``bad_words`` are tokenized here
        (``engine.bad_words``), so their ids are checked with the rest.
        The tokenizer's end-of-sequence id is the request's main one; the
        model's other end ids end it as stop token ids do (``Request``,
        vLLM's rule: they are its ``stop_reason``).
        ``priority`` orders requests under the "priority" scheduling policy
        (lower first); another than 0 is refused under "fcfs", as vLLM
        refuses it, rather than ignored. Under a reasoning parser
        (``reasoning_parser``) the request's output begins inside its
        reasoning or after it, decided here once from its prompt and its
        ``enable_thinking`` (``Reasoning.starts_inside``), and held in
        ``Request.starts_in_reasoning``: every caller reads the output by
        it, and a structured-output constraint of an output that begins
        inside holds from the end of the reasoning on
        (``StructuredOutputManager.new_grammar``); its
        ``thinking_token_budget`` is spent on that reasoning
        (``engine.thinking_budget``; refused without a reasoning parser).
        ``lora_request``: the LoRA adapter it runs with, checked here
        (``engine.lora_checks``: refused with LoRA off, or an adapter that
        cannot be served)."""
        if self.pooler is not None:
            raise InvalidRequestError(f"generation is not supported by a pooling model (runner "
                                      f"'pooling'): it serves {TASK_NAMES[self.pooler.task]}; "
                                      "start it with runner 'generate' to generate")
        self.lora_checks.check(lora_request)
        if priority != 0 and self.scheduler.config.policy != "priority":
            raise InvalidRequestError(f"priority {priority} needs the 'priority' scheduling "
                                      "policy (--scheduling-policy priority)")
        check_budget_has_parser(params.thinking_token_budget,
                                self.config.resolved_reasoning_parser)
        prompt_token_ids = self.prompt_token_ids(prompt, params)
        if params.bad_words:
            sequences = bad_words_token_ids(self.tokenizer, params.bad_words)
            params = params.replaced(bad_words_token_ids=sequences)
        # At least 1: a prompt already too long then gets the length message.
        room = max(1, self.scheduler.config.max_model_len - len(prompt_token_ids))
        if fit_context or params.max_tokens is None:
            # Blamed on the prompt alone, not on a max_tokens the context sets or cuts.
            check_context_length(len(prompt_token_ids), None, self.scheduler.config.max_model_len)
        if fit_context:
            params = params.fitted_to(room)
        elif params.max_tokens is None:
            params = params.replaced(max_tokens=room)
        check_request(prompt_token_ids, params, self.scheduler.config,
                      self.model_config.vocab_size)
        request = Request(
            req_id if req_id is not None else str(next(self.request_ids)),
            prompt_token_ids, params, eos_token_id=self.tokenizer.eos_token_id,
            priority=priority, secondary_eos_token_ids=self.model_config.eos_token_ids,
            cache_salt=cache_salt_of(prompt),
            prompt_logprob_width=entries_per_position(params.prompt_logprobs,
                                                      self.model_config.vocab_size),
            starts_in_reasoning=(self.reasoning is not None and self.reasoning.starts_inside(
                prompt_token_ids, enable_thinking)),
            lora_request=lora_request,
        )
        request.grammar = self.structured_outputs.new_grammar(params,
                                                              request.starts_in_reasoning)
        if params.thinking_token_budget is not None and self.reasoning is not None:
            request.thinking_budget = ThinkingBudget(params.thinking_token_budget,
                                                     self.reasoning.tokens, prompt_token_ids)
        return request

    def new_pooling_request(self, prompt: str | dict, params: PoolingParams,
                            req_id: str | None = None, priority: int = 0,
                            lora_request: LoRARequest | None = None,
                            task: str = "embed") -> Request:
        """The ``task`` request (one of ``supported_tasks`` of the engine's
        own task, ``PoolerSettings.task``: "embed" or "token_embed",
        "classify" or "token_classify") of ``prompt`` (an engine with a pooler
        only: ``runner="pooling"``): tokenized, cut to
        ``params.truncate_prompt_tokens``, checked (``check_pooling_prompt``;
        ``dimensions`` against the model, ``resolved_params``), nothing
        queued (a classification's params: ``resolved_classify_params``; a
        token-level task's rows within one message: ``check_pooled_rows``). It
        runs its prompt and finishes "stop" with its embedding or class
        probabilities (``RequestOutputDelta.pooled``; a token-level task's,
        one row a prompt token), sampling nothing: its sampling
        parameters are one greedy token that is never drawn. Like
        ``new_request``, any thread may call it; ``lora_request`` as
        ``new_request`` takes it (the adapter's hidden states are pooled)."""
        if self.pooler is None:
            raise InvalidRequestError(f"{TASK_NAMES.get(task, task)} are not supported by a "
                                      "generating model: start it with runner 'pooling' (or "
                                      f"convert {task!r})")
        served = supported_tasks(self.pooler.task)
        if task not in served:
            raise InvalidRequestError(f"pooling_task must be one of {list(served)}: this model "
                                      f"serves {TASK_NAMES[self.pooler.task]}, not "
                                      f"{TASK_NAMES.get(task, repr(task))}", param="task")
        self.lora_checks.check(lora_request)
        if priority != 0 and self.scheduler.config.policy != "priority":
            raise InvalidRequestError(f"priority {priority} needs the 'priority' scheduling "
                                      "policy (--scheduling-policy priority)")
        limits = self.scheduler.config
        if self.pooler.task == "classify":
            params = resolved_classify_params(params, self.pooler.use_activation, task)
        else:
            params = resolved_params(params, self.pooler.normalize, self.pooler.dimensions,
                                     self.matryoshka, self.config.model, task)
        ids = truncated_prompt(self.tokenize(prompt), params.truncate_prompt_tokens,
                               limits.max_model_len)
        check_pooling_prompt(ids, self.model_config.vocab_size, limits.max_model_len,
                             limits.num_blocks, limits.block_size)
        if is_token_task(task):
            check_pooled_rows(task, len(ids), limits.pooled_size)
        request = Request(req_id if req_id is not None else str(next(self.request_ids)), ids,
                          SamplingParams(temperature=0.0, max_tokens=1, detokenize=False),
                          eos_token_id=self.tokenizer.eos_token_id, priority=priority,
                          cache_salt=cache_salt_of(prompt), lora_request=lora_request)
        request.pooling_params = params
        return request

    def enqueue(self, request: Request) -> None:
        """Queue a request made by ``new_request``."""
        self.scheduler.add_request(request)

    def add_request(self, prompt: str | dict, params: SamplingParams,
                    req_id: str | None = None, priority: int = 0,
                    lora_request: LoRARequest | None = None) -> Request:
        """``new_request`` of a checked copy of the caller's ``params``
        (``SamplingParams.checked``: fields assigned since construction
        are checked, and later ones do not reach the request), then queued."""
        request = self.new_request(prompt, params.checked(), req_id, priority,
                                   lora_request=lora_request)
        self.enqueue(request)
        return request

    def abort(self, req_ids: list[str]) -> list[RequestOutputDelta]:
        """Finish the requests as "abort" and free their blocks; a token in
        flight for them is discarded. Unknown or finished ids are ignored.
        Returns one (last) delta per request aborted."""
        live = [r for r in req_ids if r in self.scheduler.requests]
        self.scheduler.abort_requests(live)
        return [RequestOutputDelta(r, [], True, "abort") for r in live]

    def has_unfinished_requests(self) -> bool:
        """Requests queued or running, or a step whose output is pending."""
        return self.scheduler.has_unfinished_requests() or self.in_flight is not None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, so the next prompts are computed in
        full (vLLM's, e.g. between benchmark runs); False, changing nothing,
        while a request is unfinished (its blocks hold hashes it registers)."""
        if self.has_unfinished_requests():
            return False
        self.scheduler.kv.pool.reset_prefix_cache()
        return True

    # ---- the profiler ----------------------------------------------------
    def start_profile(self, profile_prefix: str | None = None) -> None:
        """Start every worker's torch profiler (vLLM's): each rank's trace
        holds the steps it runs until ``stop_profile``, named with its rank
        after ``profile_prefix`` (``worker.torch_profiler``). The call
        travels as a control call, behind any step already sent, and
        returns once every rank has started. ``RuntimeError`` (vLLM's
        message) without a ``profiler_config``."""
        if self.config.profiler is None:
            raise RuntimeError(PROFILING_OFF)
        self.executor.collective_rpc("start_profile", {
            "profile_prefix": profile_prefix,
            "data_parallel_rank": self.config.data_parallel_rank})
        self.profiling = True

    def stop_profile(self) -> None:
        """Stop every worker's profiler; returns once every rank has written
        its trace (which may take long for a long recording: no time limit
        but a worker's failure)."""
        if self.config.profiler is None:
            raise RuntimeError(PROFILING_OFF)
        self.profiling = False
        written = self.executor.collective_rpc("stop_profile", timeout=None)
        logger.info("profiler traces written: %s", ", ".join(f for w in written for f in w))

    # ---- sleep mode ----------------------------------------------------
    def sleep(self, level: int = 1) -> list[RequestOutputDelta]:
        """vLLM's sleep mode (``enable_sleep_mode``), with vLLM's default of
        what becomes of unfinished requests (mode "abort"): they are
        aborted (their last deltas returned), a step in flight is absorbed,
        the prefix cache is reset (the KV blocks' contents are forgotten),
        then every worker frees its memory (``runner.sleep_mode``: level 1
        keeps the weights on the host, level 2 reads them again on waking).
        Until every tag is woken no step is scheduled: requests queued
        meanwhile wait, and run after ``wake_up``. Asleep already: a
        warning, nothing done (vLLM's). Without ``enable_sleep_mode``:
        vLLM's ``AssertionError``."""
        self.check_sleep(level)
        if self.sleeping_tags:
            logger.warning("the engine is sleeping already")
            return []
        deltas = self.abort(list(self.scheduler.requests))
        while self.has_unfinished_requests():  # the step in flight (async scheduling)
            deltas += self.step()
        self.scheduler.kv.pool.reset_prefix_cache()
        self.executor.collective_rpc("sleep", {"level": level}, timeout=600)
        self.sleeping_tags = set(SLEEP_TAGS)
        return deltas

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore the workers' memory of ``tags`` ("weights", "kv_cache";
        None: every tag still asleep, weights first); scheduling resumes
        once all is back. Not sleeping, or a tag named that is awake
        already: a warning, nothing done (vLLM's). An unknown tag:
        ``ValueError``."""
        self.check_wake_up(tags)
        tags = ([t for t in SLEEP_TAGS if t in self.sleeping_tags] if tags is None
                else list(tags))
        if not self.sleeping_tags:
            logger.warning("the engine is not sleeping")
            return
        awake = sorted(set(tags) - self.sleeping_tags)
        if awake:
            logger.warning("wake_up tags %s are not asleep (asleep: %s)", awake,
                           sorted(self.sleeping_tags))
            return
        self.executor.collective_rpc("wake_up", {"tags": tags}, timeout=600)
        self.sleeping_tags -= set(tags)

    def is_sleeping(self) -> bool:
        """Some of the workers' memory is asleep (no step is scheduled)."""
        return bool(self.sleeping_tags)

    def check_sleep(self, level: int) -> None:
        """``sleep``'s refusals, raised before it changes anything: sleep
        mode off (``AssertionError``), a bad level (``ValueError``)."""
        self._check_sleep_mode()
        if level not in SLEEP_LEVELS:
            raise ValueError(f"sleep level must be one of {list(SLEEP_LEVELS)}, got {level!r}")

    def check_wake_up(self, tags: list[str] | None) -> None:
        """``wake_up``'s refusals, raised before it changes anything: sleep
        mode off (``AssertionError``), an unknown tag (``ValueError``)."""
        self._check_sleep_mode()
        unknown = sorted(set(tags or ()) - set(SLEEP_TAGS))
        if unknown:
            raise ValueError(f"unknown wake_up tags {unknown}; the tags are {list(SLEEP_TAGS)}")

    def _check_sleep_mode(self) -> None:
        if not self.config.enable_sleep_mode:
            raise AssertionError("Sleep mode is not enabled in the model config")

    # ---- the step ------------------------------------------------------
    def step(self, after_send: Callable[[], None] | None = None,
             num_admitting: int = 0) -> list[RequestOutputDelta]:
        """One turn of the engine loop; returns the deltas of one step.
        ``after_send`` is called once the step's plan (and its bitmask, if
        sent now) is on its way, or none was due, before the wait for an
        output: work that should not delay the plan (the serving loop's
        replies to its clients). ``num_admitting``: for the stats line the
        step may log, as ``get_stats`` takes it.

        Synchronous: schedule step N, send it (and its bitmask), wait for its
        output, absorb it. Async (``async_scheduling``): schedule step N+1
        while step N's bitmask fills (started when N-1 was absorbed), send
        that bitmask, then plan N+1, then wait for step N's output, absorb it
        and start N+1's fill; the workers compute N+1 while the host absorbs
        N and later schedules N+2. The bitmask goes before the plan so that
        a worker samples N and prepares N+1 at once: the device then runs
        forward N, sample N and forward N+1 with no host work between them.
        At most two steps are in flight; a decode in N+1 reads its input
        token, sampled by N, on the device. The first call after idling
        returns no deltas.

        Order that keeps the matchers right: a fill reads every grammar as
        it is after the step before its own is absorbed, and no matcher is
        used between a fill's start and its ``result()`` (scheduling only
        preempts, which leaves a matcher as it is: it has consumed exactly
        the request's output tokens).
        """
        self._raise_if_broken()
        awake = not self.sleeping_tags
        plan = (self.scheduler.schedule()
                if awake and self.scheduler.has_unfinished_requests() else None)
        if self.config.async_scheduling:
            self._send_bitmask()
            sent = self._send(plan)
            if after_send is not None:
                after_send()
            sent, self.in_flight = self.in_flight, sent
            deltas = self._absorb(sent)
            self._start_bitmask(self.in_flight)
        else:
            sent = self._send(plan)
            self._start_bitmask(sent, background=False)
            self._send_bitmask()
            if after_send is not None:
                after_send()
            deltas = self._absorb(sent)
        deltas = self.scheduler.take_unadmitted() + deltas
        self.maybe_log_stats(num_admitting)
        return deltas

    def _send(self, plan: SchedulerOutput | None) -> _SentStep | None:
        """Hand ``plan`` to the executor; an empty plan (nothing scheduled,
        finished or preempted: the requests left all have their last token
        in flight) is settled here with an empty output, so no round trip to
        the workers keeps the loop from reading new requests."""
        if plan is None:
            return None
        if plan.is_empty():
            return _SentStep(plan, _Settled(ModelRunnerOutput(step_id=plan.step_id,
                                                              sampled_token_ids=[])))
        if trace.enabled and plan.scheduled_new_reqs:
            trace.mark("step_scheduled", plan.step_id)
        if trace.enabled:
            trace.mark("step_sent", plan.step_id)
        return _SentStep(plan, self.executor.execute_model(plan))

    def _start_bitmask(self, sent: _SentStep | None, background: bool = True) -> None:
        """Start filling the bitmask of a step with constrained requests,
        from the grammars as they are now (every earlier step absorbed)."""
        if sent is not None and sent.plan.structured_output_req_ids:
            self.pending_bitmask = self.structured_outputs.start_bitmask(
                sent.plan, self.scheduler.requests, background,
                self.scheduler.step_drafts(sent.plan.step_id))

    def _send_bitmask(self) -> None:
        """Send the bitmask started last, once filled (nothing if none)."""
        pending, self.pending_bitmask = self.pending_bitmask, None
        if pending is not None:
            message = pending.result()
            if message.draft_req_ids:  # the step's output must report their drafts
                self.scheduler.expect_drafts(message.step_id, message.draft_req_ids)
            self.executor.sample_tokens(message)

    def _absorb(self, sent: _SentStep | None) -> list[RequestOutputDelta]:
        if sent is None:
            return []
        output = sent.future.result()
        if trace.enabled:
            trace.mark("step_output", sent.plan.step_id)
        try:
            deltas = self.scheduler.update_from_output(sent.plan, output)
        except ValueError as e:  # the reply broke the runner's contract
            self.broken_reply = f"the output rank's reply to step {sent.plan.step_id}: {e}"
            raise
        num_generated = sum(len(d.new_token_ids) for d in deltas)
        self.counters.on_step(sent.plan.total_num_scheduled_tokens, num_generated)
        return deltas

    def _raise_if_broken(self) -> None:
        """After a reply that broke the runner's contract, every step fails
        as after a worker's failure: ``WorkerFailure`` naming the reply."""
        if self.broken_reply is not None:
            raise WorkerFailure(f"the engine failed at {self.broken_reply}")

    # ---- stats ---------------------------------------------------------
    def get_stats(self, num_admitting: int = 0,
                  admitting_loras: Iterable[LoRARequest | None] = ()) -> EngineStats:
        """The engine's state now. ``num_admitting``: requests the caller
        holds before ``enqueue`` (a server's, while their grammar compiles
        or their text is tokenized), counted as waiting, as vLLM counts a
        request from its arrival; the caller owns them, so it says how many,
        and ``admitting_loras`` their adapters (None: none), counted as
        waiting adapters (``stats.snapshot``)."""
        return snapshot(self.scheduler, self.counters, num_admitting, admitting_loras)

    def _prefix_counts(self) -> tuple[int, int]:
        return self.scheduler.kv.prefix_hits, self.scheduler.kv.prefix_queries

    def check_health(self) -> None:
        """Raise the executor's ``WorkerFailure`` (a rank that died or failed,
        named) if the workers have stopped; vLLM's ``check_health``. A step
        raises it too; this is for a caller that sends none (an idle server).
        After a reply that broke the runner's contract: its ``WorkerFailure``."""
        self._raise_if_broken()
        self.executor.check_health()

    def maybe_log_stats(self, num_admitting: int = 0) -> None:
        """Log the stats line if its interval has passed (and logging is on);
        ``num_admitting`` as ``get_stats`` takes it."""
        if self.stats_logger is not None:
            self.stats_logger.maybe_log(num_admitting)

    def shutdown(self) -> None:
        """Stop the executor; a step still in flight is dropped first, so no
        output of it keeps device memory alive."""
        self.in_flight = None
        self.pending_bitmask = None
        self.structured_outputs.shutdown()
        self.executor.shutdown()


def cache_salt_of(prompt: str | dict) -> str | None:
    """A dict prompt's ``cache_salt`` (vLLM's TextPrompt / TokensPrompt
    key), None where it has none; one that is not a non-empty string is
    refused, as vLLM's server refuses it."""
    if not isinstance(prompt, dict) or prompt.get("cache_salt") is None:
        return None
    salt = prompt["cache_salt"]
    if not isinstance(salt, str) or not salt:
        raise InvalidRequestError("cache_salt must be a non-empty string if provided",
                                  param="cache_salt")
    return salt


def checked_token_ids(ids) -> list[int]:
    """``prompt_token_ids`` as a list of ints: a sequence of integers (numpy's
    too), never a string, and no bools or floats (``int()`` would quietly
    turn "123" into [1, 2, 3] and 2.5 into 2)."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise InvalidRequestError(
            f"prompt_token_ids must be a list of ints, got {type(ids).__name__}")
    out = []
    for t in ids:
        try:
            if isinstance(t, bool):
                raise TypeError
            out.append(operator.index(t))
        except TypeError:
            raise InvalidRequestError(f"prompt_token_ids must be ints, got {t!r}") from None
    return out
