"""``LLM``: the in-process API, with vLLM's names."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import msgspec
import torch

from checkpoint.chat_template import chat_prompt_ids
from engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine, cache_salt_of
from engine.metrics_reader import Metric
from engine.output_text import OutputText, with_decoded_tokens
from engine.outputs import (
    CompletionOutput,
    RequestOutput,
    RequestOutputDelta,
    cumulative_logprob,
)
from engine.pooling_outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
)
from engine.pooling_params import PoolingParams
from engine.pooling_tasks import check_pooling_task, is_token_task
from engine.progress import RequestProgress
from engine.prometheus_metrics import Metrics
from engine.reasoning import enable_thinking_of
from engine.request import Request
from engine.request_metrics import RequestStateStats, RequestTimes, request_stats
from engine.sampling_params import SamplingParams
from engine.scoring import (
    check_cross_encoder,
    cosine_similarity,
    pair_max_length,
    score_pairs,
    scored_token_ids,
)
from engine.scoring_outputs import ScoringOutput, ScoringRequestOutput
from engine.tool_depth import check_tool_depth
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest


class LLM:
    """``LLM(model="tiny", tensor_parallel_size=2, device="cpu", ...)``.

    Keyword arguments are those of ``EngineConfig``. Use as a context
    manager, or call ``shutdown()``: it stops every worker process (as
    does the garbage collector, once nothing refers to the ``LLM``).
    """

    def __init__(self, model: str = "tiny", **kwargs):
        """``kwargs``: ``EngineConfig``'s fields, vLLM's names; among them
        the vLLM options tprun takes only at the values that ask for what it
        does (``trust_remote_code``, ``swap_space``: changing nothing;
        ``quantization``, ``kv_cache_dtype``, ...: other values are a
        ``ValueError`` naming the option). A vLLM option it does not have at
        all is a TypeError that says so."""
        self._start(engine_config("LLM", model, kwargs))

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm._start(config)
        return llm

    def _start(self, config: EngineConfig) -> None:
        # A worker in this process (TP=1) sizes torch's thread pool for
        # itself; the caller's setting comes back at shutdown.
        self._caller_num_threads = torch.get_num_threads()
        try:
            self.engine = LLMEngine(config)
        except BaseException:
            torch.set_num_threads(self._caller_num_threads)
            raise
        # The Prometheus metrics get_metrics reads, kept as vLLM keeps them:
        # only with stats logging on (disable_log_stats=False).
        self._metrics = None if config.disable_log_stats else Metrics(
            config.model, 0 if config.lora_config is None else config.lora_config.max_loras)
        # Holds the engine, not the LLM, so the LLM itself can be collected;
        # dead once the engine is shut down.
        self._finalizer = weakref.finalize(self, _stop, self.engine, self._caller_num_threads)

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` and ``chat`` sample with when given no
        ``SamplingParams``: the defaults, with the model's recommended ones
        from its generation_config.json (``LLMEngine.sampling_defaults``)."""
        return SamplingParams(**self.engine.sampling_defaults)

    def reset_prefix_cache(self) -> bool:
        """``LLMEngine.reset_prefix_cache``: whether the cache was emptied."""
        return self.engine.reset_prefix_cache()

    def start_profile(self, profile_prefix: str | None = None) -> None:
        """Start every worker's torch profiler (``LLMEngine.start_profile``;
        needs ``profiler_config``); trace names begin with ``profile_prefix``."""
        self.engine.start_profile(profile_prefix)

    def stop_profile(self) -> None:
        """Stop the profilers; returns once every worker's trace is written."""
        self.engine.stop_profile()

    def get_metrics(self) -> list[Metric]:
        """vLLM's: the metrics of this ``LLM`` now, as ``engine.metrics_reader``'s
        records (``Counter``, ``Gauge``, ``Histogram``, ``Vector``), the
        ones ``serve``'s ``/metrics`` shows under the same ``tprun:`` names
        (``engine.prometheus_metrics``): running and waiting requests and KV
        usage now; prompt and generation tokens, preemptions, prefix-cache
        lookups and hits since the engine started; each finished engine
        request by its ``finished_reason``, with its end-to-end latency,
        and its time to first token and inter-token latencies, counted from
        when this ``LLM`` made it (``generate``, ``chat``, the pooling calls).
        Needs ``LLM(..., disable_log_stats=False)``, as vLLM's does; else
        an ``AssertionError`` saying stat logging is disabled (vLLM's
        error), since no metric was kept."""
        if self._metrics is None:
            raise AssertionError("Stat logging disabled: LLM(..., disable_log_stats=False) "
                                 "keeps the metrics get_metrics reads")
        return self._metrics.snapshot(self.engine.get_stats())

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (``LLM(..., enable_sleep_mode=True)``): level 1
        moves the weights to host memory and frees the KV cache; level 2
        frees both (``wake_up`` reads the weights from the checkpoint
        again). The prefix cache is reset; unfinished requests are aborted
        (vLLM's default); until ``wake_up`` brings everything back,
        ``generate`` and the other calls that run requests raise.
        ``LLMEngine.sleep`` has the rest."""
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what ``sleep`` freed: ``tags`` "weights" and/or
        "kv_cache" (None: all), so the weights can come back before the
        cache takes its memory again."""
        self.engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping()

    def _check_usable(self) -> None:
        """A call that runs requests needs a live engine that is awake."""
        if not self._finalizer.alive:
            raise RuntimeError("this LLM has been shut down")
        if self.engine.is_sleeping():
            raise RuntimeError(f"the engine is sleeping ({sorted(self.engine.sleeping_tags)} "
                               f"not woken up): call wake_up() first")

    @property
    def llm_engine(self) -> LLMEngine:
        """The engine (vLLM's name for it; also ``engine``)."""
        return self.engine

    def generate(
        self,
        prompts: str | dict | Iterable[str | dict],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in the order of ``prompts``,
        each with ``n`` completions (``SamplingParams.choices``) and its
        ``metrics`` (``engine.request_metrics``: every time, queueing and
        scheduling included, as this process saw it). ``priority``:
        one a prompt, for the "priority" scheduling policy (lower first).
        ``lora_request``: the LoRA adapter of every prompt, or one a prompt
        (None: the base model); needs ``enable_lora``.

        If the call is interrupted (Ctrl-C, an exception from a callback),
        its unfinished requests are aborted before the exception goes on, so
        the next call starts from an idle engine.
        """
        return self._generate(prompts, sampling_params, use_tqdm, priority,
                              lora_request=lora_request)

    def _generate(self, prompts, sampling_params, use_tqdm: bool, priority,
                  enable_thinking: bool = True, lora_request=None) -> list[RequestOutput]:
        """``generate``, each request with ``enable_thinking`` (``chat``'s,
        from its template's kwargs: the engine's reasoning parser reads it)."""
        self._check_usable()
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = _params_per_prompt(sampling_params, len(prompts))
        priority = [0] * len(prompts) if priority is None else list(priority)
        if len(priority) != len(prompts):
            raise ValueError(f"give one priority a prompt ({len(prompts)}), got {len(priority)}")
        loras = loras_per_prompt(lora_request, len(prompts))
        engine = self.engine
        # Make (and so check) all before queueing any: a bad prompt queues
        # nothing. As vLLM's LLM, max_tokens past the context ends at it.
        # Each request arrives before its prompt is tokenized, as in vLLM.
        requests = [[(RequestTimes(), engine.new_request(p, choice, priority=rank,
                                                         fit_context=True,
                                                         enable_thinking=enable_thinking,
                                                         lora_request=lora))
                     for choice in pp.choices()]
                    for p, pp, rank, lora in zip(prompts, params, priority, loras)]
        results = []
        choices: dict[str, _Choice] = {}
        for prompt, choice_requests in zip(prompts, requests):
            text = prompt if isinstance(prompt, str) else prompt.get("prompt")
            first = choice_requests[0][1]
            result = RequestOutput(first.req_id, text, first.prompt_token_ids)
            results.append(result)
            for index, (times, request) in enumerate(choice_requests):
                engine.enqueue(request)
                completion = CompletionOutput(index, "", [])
                result.outputs.append(completion)
                choices[request.req_id] = _Choice(result, completion, OutputText(
                    engine.tokenizer, request.prompt_token_ids, request.sampling_params),
                    request, times)
        try:
            self._run_to_completion(choices, use_tqdm)
        except BaseException:
            unfinished = [r for r, c in choices.items() if not c.completion.finished()]
            with contextlib.suppress(Exception):  # an engine that died stays dead
                engine.abort(unfinished)
            self._count_finished("abort", [choices[r].times.arrival_ts for r in unfinished])
            raise
        for result, choice_requests in zip(results, requests):
            result.metrics = _metrics(result, [choices[r.req_id] for _, r in choice_requests])
        return results

    def embed(
        self,
        prompts: str | dict | Iterable[str | dict],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = False,
        truncate_prompt_tokens: int | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """vLLM's: each prompt's embedding, in the order of ``prompts``
        (a pooling engine only: ``runner="pooling"``; a generating one
        refuses with ``InvalidRequestError``). ``pooling_params``: one for
        every prompt or one per prompt (None: the defaults, normalized, the
        model's hidden size); ``truncate_prompt_tokens`` sets theirs where
        they leave it unset. ``lora_request``: as ``generate`` takes it.
        Every prompt is checked before any is queued; an interrupted call
        aborts its unfinished requests."""
        pooled = self._pool(prompts, pooling_params, use_tqdm, truncate_prompt_tokens,
                            lora_request, "embed")
        return _request_outputs(pooled, EmbeddingRequestOutput, EmbeddingOutput)

    def classify(
        self,
        prompts: str | dict | Iterable[str | dict],
        *,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = False,
        truncate_prompt_tokens: int | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[ClassificationRequestOutput]:
        """vLLM's: each prompt's class probabilities, in the order of
        ``prompts`` (a classifier only: a sequence classifier's checkpoint
        or ``convert="classify"``; another engine refuses with
        ``InvalidRequestError``). ``pooling_params`` as ``embed`` takes them
        (of a classification: ``use_activation``, ``truncate_prompt_tokens``);
        the rest as ``embed``."""
        pooled = self._pool(prompts, pooling_params, use_tqdm, truncate_prompt_tokens,
                            lora_request, "classify")
        return _request_outputs(pooled, ClassificationRequestOutput, ClassificationOutput)

    def encode(
        self,
        prompts: str | dict | Iterable[str | dict],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        pooling_task: str | None = None,
    ) -> list[PoolingRequestOutput]:
        """vLLM's generic pooling call: each prompt's pooled output for
        ``pooling_task``, in the order of ``prompts``, as vLLM's
        ``PoolingRequestOutput`` whose ``outputs.data`` is a float32 tensor.
        ``pooling_task`` is required and must be a task the engine serves
        (``engine.pooling_tasks``: "embed" on an embedding model, the values
        ``embed`` gives, or "token_embed", each prompt token's embedding,
        ``data`` ``[n_tokens, hidden]``; "classify" on a classifier, those of
        ``classify``, or "token_classify", each prompt token's, ``data``
        ``[n_tokens, num_labels]``); another, or a generating engine, is
        refused with vLLM's message (``InvalidRequestError``). ``pooling_params``,
        ``truncate_prompt_tokens``, ``lora_request`` and ``use_tqdm`` as
        ``embed`` takes them."""
        pooler = self.engine.pooler
        task = check_pooling_task(pooling_task, None if pooler is None else pooler.task)
        pooled = self._pool(prompts, pooling_params, use_tqdm, truncate_prompt_tokens,
                            lora_request, task)
        return _request_outputs(pooled, PoolingRequestOutput, PoolingOutput,
                                per_token=is_token_task(task))

    def _pool(self, prompts: str | dict | Iterable[str | dict],
              pooling_params: PoolingParams | Sequence[PoolingParams] | None, use_tqdm: bool,
              truncate_prompt_tokens: int | None,
              lora_request: LoRARequest | Sequence[LoRARequest | None] | None,
              task: str) -> list[tuple[Request, bytes]]:
        """Run ``prompts`` as ``task`` requests (``new_pooling_request``) to
        their end: each request with the engine's output bytes, in prompt
        order. Every prompt is checked before any is queued; an interrupted
        call aborts its unfinished requests."""
        self._check_usable()
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params = pooling_params if pooling_params is not None else PoolingParams()
        params = [params] * len(prompts) if isinstance(params, PoolingParams) else list(params)
        if len(params) != len(prompts) or not all(isinstance(p, PoolingParams) for p in params):
            raise ValueError("pooling_params is a PoolingParams or one per prompt")
        if truncate_prompt_tokens is not None:
            params = [p if p.truncate_prompt_tokens is not None else msgspec.structs.replace(
                p, truncate_prompt_tokens=truncate_prompt_tokens) for p in params]
        loras = loras_per_prompt(lora_request, len(prompts))
        engine = self.engine
        arrival = time.monotonic()  # before any prompt is tokenized, as generate's
        requests = [engine.new_pooling_request(p, pp, lora_request=lora, task=task)
                    for p, pp, lora in zip(prompts, params, loras)]
        for request in requests:
            engine.enqueue(request)
        pooled: dict[str, bytes] = {}
        try:
            with RequestProgress(len(requests), task, use_tqdm) as progress:
                while engine.has_unfinished_requests():
                    done = [d for d in engine.step() if d.pooled is not None]
                    pooled.update((d.req_id, d.pooled) for d in done)
                    for d in done:
                        self._count_finished(d.finish_reason, [arrival])
                    progress.advance(len(done), 0)
        except BaseException:
            unfinished = [r.req_id for r in requests if r.req_id not in pooled]
            with contextlib.suppress(Exception):
                engine.abort(unfinished)
            self._count_finished("abort", [arrival] * len(unfinished))
            raise
        return [(r, pooled[r.req_id]) for r in requests]

    def score(
        self,
        data_1: str | dict | Sequence[str | dict],
        data_2: str | dict | Sequence[str | dict],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
        pooling_params: PoolingParams | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[ScoringRequestOutput]:
        """vLLM's, for an embedding model: the cosine similarity of each
        pair's two embeddings (``engine.scoring``), one output a pair in
        pair order. ``data_1`` and ``data_2`` are a prompt (a text or a
        ``{"prompt_token_ids"}`` dict, as ``embed`` takes) or a list of them,
        paired 1 to 1, 1 to N or N to N (else ``InvalidRequestError``); each
        given prompt is embedded once (a 1 to N request's first one too), in
        one ``embed`` call, with
        ``pooling_params``, ``truncate_prompt_tokens``, ``lora_request`` and
        ``use_tqdm`` as ``embed`` takes them (one adapter for all). On a
        classifier of one label (a cross-encoder) each pair is one prompt
        and its score the classifier's probability
        (``_cross_encoding_scores``); a classifier of more labels refuses. A
        generating engine refuses with vLLM's message."""
        if self.engine.pooler is None:
            raise InvalidRequestError("LLM.score() is only supported for pooling models. Try "
                                      "passing `--runner pooling` to use the model as a pooling "
                                      "model.")
        if lora_request is not None and not isinstance(lora_request, LoRARequest):
            raise InvalidRequestError("LLM.score takes one lora_request for every prompt",
                                      param="lora_request")
        firsts = [data_1] if isinstance(data_1, (str, dict)) else list(data_1)
        seconds = [data_2] if isinstance(data_2, (str, dict)) else list(data_2)
        pairs = score_pairs(len(firsts), len(seconds), "data_1", "data_2")
        if self.engine.pooler.task == "classify":
            return self._cross_encoding_scores(firsts, seconds, pairs, pooling_params, use_tqdm,
                                               truncate_prompt_tokens, lora_request)
        embedded = self.embed([*firsts, *seconds], pooling_params, use_tqdm,
                              truncate_prompt_tokens, lora_request)
        pad = self.engine.tokenizer.pad_token_id
        outputs = []
        for i, j in pairs:
            one, two = embedded[i], embedded[len(firsts) + j]
            score = cosine_similarity(one.outputs.embedding, two.outputs.embedding)
            outputs.append(ScoringRequestOutput(
                f"{one.request_id}_{two.request_id}", ScoringOutput(score),
                scored_token_ids(one.prompt_token_ids, two.prompt_token_ids, pad)))
        return outputs

    def _cross_encoding_scores(self, firsts: list, seconds: list,
                               pairs: list[tuple[int, int]],
                               pooling_params: PoolingParams | None, use_tqdm: bool,
                               truncate_prompt_tokens: int | None,
                               lora_request: LoRARequest | None) -> list[ScoringRequestOutput]:
        """``score`` on a classifier of one label (a cross-encoder,
        ``engine.scoring``): each pair's two texts as one prompt
        (``Tokenizer.encode_pair``), classified; its score the one logit
        through the classifier's activation (``engine.classify_head``).
        Texts only, as vLLM takes them."""
        check_cross_encoder(self.engine.model_config.num_labels)
        for side, name in ((firsts, "data_1"), (seconds, "data_2")):
            if not all(isinstance(p, str) for p in side):
                raise InvalidRequestError("a cross-encoder scores texts only: each prompt of "
                                          f"{name} must be a str", param=name)
        if pooling_params is not None and pooling_params.truncate_prompt_tokens is not None:
            truncate_prompt_tokens = pooling_params.truncate_prompt_tokens
            pooling_params = msgspec.structs.replace(pooling_params, truncate_prompt_tokens=None)
        max_length = pair_max_length(truncate_prompt_tokens,
                                     self.engine.scheduler.config.max_model_len)
        tokenizer = self.engine.tokenizer
        prompts = [{"prompt_token_ids": tokenizer.encode_pair(firsts[i], seconds[j], max_length)}
                   for i, j in pairs]
        classified = self.classify(prompts, pooling_params=pooling_params, use_tqdm=use_tqdm,
                                   lora_request=lora_request)
        return [ScoringRequestOutput(c.request_id, ScoringOutput(c.outputs.probs[0]),
                                     c.prompt_token_ids) for c in classified]

    def chat(
        self,
        messages: list[dict] | Sequence[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """``generate`` over chats: each a list of messages ({"role",
        "content"}, an assistant's "tool_calls", a tool answer's
        "tool_call_id") rendered with the model's chat template (or
        ``chat_template``), as the HTTP server's /v1/chat/completions renders
        them (``chat_prompt_ids``). One chat or a list of them; each output's
        ``prompt`` is the rendered text. ``tools`` (OpenAI's tool dicts) are
        the template's ``tools``, for every chat; as in vLLM's ``LLM.chat``
        they are only rendered: the output is not held to a call; one nested
        deeper than ``tool_depth.MAX_TOOL_DEPTH`` is refused before any
        rendering (``InvalidRequestError`` naming ``tools``).
        A ``chat_template`` key of ``chat_template_kwargs`` is the template
        where ``chat_template`` is not given (vLLM's ``LLM.chat`` hands the
        kwargs to the template's renderer, whose ``chat_template`` it is).
        ``continue_final_message`` (with ``add_generation_prompt`` False)
        leaves the final message open for the model to go on. Under a
        reasoning parser, ``enable_thinking`` in ``chat_template_kwargs``
        tells the engine where the output begins, as the HTTP server tells it.
        ``lora_request``: as ``generate`` takes it, one a chat or one for all."""
        chats = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        check_tool_depth(tools)
        tokenizer = self.engine.tokenizer
        if chat_template is None:
            chat_template = _kwargs_template(chat_template_kwargs)
        rendered = [chat_prompt_ids(tokenizer, chat, chat_template=chat_template,
                                    add_generation_prompt=add_generation_prompt,
                                    extra=chat_template_kwargs,
                                    continue_final_message=continue_final_message,
                                    tools=tools)
                    for chat in chats]
        outputs = self._generate([{"prompt_token_ids": ids} for _, ids in rendered],
                                 sampling_params, use_tqdm, None,
                                 enable_thinking_of(chat_template_kwargs),
                                 lora_request=lora_request)
        for output, (text, _) in zip(outputs, rendered):
            output.prompt = text
        return outputs

    def beam_search(self, prompts: str | dict | Iterable[str | dict],
                    params: BeamSearchParams,
                    lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                    ) -> list[BeamSearchOutput]:
        """vLLM's: each prompt's ``params.beam_width`` best continuations,
        best first (``engine.beam_search``: the rule, the score, and why
        ``2 * beam_width`` must be within ``max_logprobs``). Each step is one
        ``generate`` call over every live beam of every prompt; a sequence's
        tokens are its prompt's and its own (an end-of-sequence id kept), as
        vLLM's. A prompt's ``cache_salt`` and LoRA adapter (``lora_request``
        as ``generate`` takes it) go with each of its beams' requests."""
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        engine = self.engine
        limits = engine.scheduler.config
        params.check(limits.max_logprobs)
        search = BeamSearch([engine.tokenize(p) for p in prompts], params,
                            engine.model_config.eos_token_ids, limits.max_model_len)
        salts = [cache_salt_of(p) for p in prompts]
        loras = loras_per_prompt(lora_request, len(prompts))
        while requests := search.requests():
            owners = search.request_prompts()
            salted = [{"prompt_token_ids": r} | ({"cache_salt": salts[i]} if salts[i] else {})
                      for r, i in zip(requests, owners)]
            outputs = self.generate(salted, search.step_params,
                                    lora_request=[loras[i] for i in owners])
            search.advance([o.outputs[0].logprobs[0] for o in outputs])
        return search.outputs(engine.tokenizer.decode)

    def _run_to_completion(self, choices: dict[str, _Choice], use_tqdm: bool) -> None:
        """Step until the engine is idle, adding each delta to its output; a
        choice whose text meets a stop string is aborted then."""
        engine = self.engine
        with RequestProgress(len(choices), "generate", use_tqdm) as progress:
            while engine.has_unfinished_requests():
                # Deltas of an earlier, interrupted call's requests are not ours.
                deltas = [d for d in engine.step() if d.req_id in choices]
                now = time.monotonic()  # when this step's tokens came
                ended = [d for d in deltas if _absorb(choices[d.req_id], d, now, self._metrics)]
                for d in ended:
                    choice = choices[d.req_id]
                    self._count_finished(choice.completion.finish_reason,
                                         [choice.times.arrival_ts], now)
                stopped = [d.req_id for d in ended if not d.finished]  # at a stop string
                if stopped:
                    engine.abort(stopped)
                progress.advance(len(ended), sum(len(d.new_token_ids) for d in deltas))

    def _count_finished(self, reason: str, arrivals: list[float],
                        now: float | None = None) -> None:
        """Engine requests that arrived at ``arrivals`` (monotonic) ended
        ``now`` (None: the time of this call) for ``reason``, in the
        metrics, when they are kept."""
        if self._metrics is not None:
            now = time.monotonic() if now is None else now
            for arrival in arrivals:
                self._metrics.finished(reason, now - arrival)

    def shutdown(self) -> None:
        """Stop the workers and give the caller back its torch thread count
        (what the garbage collector does too; a second call does nothing)."""
        self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def engine_config(caller: str, model: str, kwargs: dict) -> EngineConfig:
    """The ``EngineConfig`` of ``caller(model=model, **kwargs)`` (``LLM``,
    ``AsyncLLM``): a keyword that is no field of it is a TypeError that
    says so (a vLLM option tprun does not have at all)."""
    unknown = sorted(set(kwargs) - {f.name for f in dataclasses.fields(EngineConfig)})
    if unknown:
        raise TypeError(f"{caller}() got {', '.join(map(repr, unknown))}: not an option of "
                        f"tprun's (its options are EngineConfig's fields)")
    return EngineConfig(model=model, **kwargs)


def _kwargs_template(chat_template_kwargs: dict | None) -> str | None:
    """The ``chat_template`` key of ``LLM.chat``'s ``chat_template_kwargs``
    (None: none); ``InvalidRequestError`` where it is no text."""
    template = (chat_template_kwargs or {}).get("chat_template")
    if template is not None and not isinstance(template, str):
        raise InvalidRequestError("chat_template_kwargs.chat_template must be a template's text",
                                  param="chat_template_kwargs")
    return template


def _stop(engine: LLMEngine, caller_num_threads: int) -> None:
    """``LLM.shutdown``'s work, also run when an ``LLM`` is collected."""
    try:
        engine.shutdown()
    finally:
        torch.set_num_threads(caller_num_threads)


class _Choice(NamedTuple):
    """One engine request of a ``generate`` call: completion ``index`` of
    ``output``, its tokens and text in ``text``, its times in ``times``."""

    output: RequestOutput
    completion: CompletionOutput
    text: OutputText
    request: Request
    times: RequestTimes


def _request_outputs(pooled: list[tuple[Request, bytes]], request_output: type,
                     output: type, per_token: bool = False) -> list:
    """``_pool``'s requests and bytes as vLLM's records of ``embed``,
    ``classify`` or ``encode``: ``request_output`` (a
    ``PoolingRequestOutput``) of ``output.from_bytes`` (one row a prompt
    token where ``per_token``), with the prompt's token ids after any
    truncation and its prefix-cache hits."""
    return [request_output(r.req_id, output.from_bytes(data, r.num_prompt_tokens)
                           if per_token else output.from_bytes(data),
                           list(r.prompt_token_ids), r.num_cached_tokens or 0)
            for r, data in pooled]


def _metrics(output: RequestOutput, choices: list[_Choice]) -> RequestStateStats:
    """A finished output's metrics: its choices' times, with the scheduler's
    queueing and first scheduling of each."""
    for choice in choices:
        choice.times.queued_ts = choice.request.queued_ts
        choice.times.scheduled_ts = choice.request.scheduled_ts
    return request_stats([c.times for c in choices],
                         sum(len(c.token_ids) for c in output.outputs))


def loras_per_prompt(lora_request, num_prompts: int) -> list:
    """``generate``'s ``lora_request`` as one entry a prompt (vLLM's rule:
    one adapter for all, or a list as long as the prompts)."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    loras = list(lora_request)
    if len(loras) != num_prompts:
        raise InvalidRequestError(f"give one lora_request a prompt ({num_prompts}), got "
                                  f"{len(loras)}", param="lora_request")
    return loras


def _params_per_prompt(sampling_params: SamplingParams | Sequence[SamplingParams],
                       num_prompts: int) -> list[SamplingParams]:
    """Checked copies (``SamplingParams.checked``) of the parameters, one
    per prompt: the one check the caller's parameters get (``choices`` and
    ``LLMEngine.new_request`` take them as they are), and what the engine
    works on, so the caller's later assignments never reach a request."""
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params.checked()] * num_prompts
    sampling_params = list(sampling_params)
    if not all(isinstance(p, SamplingParams) for p in sampling_params):
        raise ValueError("sampling_params is a SamplingParams or a list of them, "
                         f"got {type(sampling_params).__name__}")
    if len(sampling_params) != num_prompts:
        raise ValueError("give one SamplingParams, or one per prompt")
    return [p.checked() for p in sampling_params]


def _absorb(choice: _Choice, delta: RequestOutputDelta, now: float,
            metrics: Metrics | None) -> bool:
    """Add ``delta``, which came at ``now``, to its choice (its token times
    into ``metrics`` too, when they are kept); whether the choice has now
    finished (the engine ended it, or its text met a stop string)."""
    completion = choice.completion
    if completion.finished():
        return False  # stopped at a stop string: what the engine still sends is dropped
    if delta.new_token_ids and metrics is not None:
        metrics.observe_tokens(choice.times, len(delta.new_token_ids), now)
    elif delta.new_token_ids:
        choice.times.tokens_at(now)
    text = choice.text
    _absorb_prompt_side(choice.output, delta, text.tokenizer)
    text.add(delta)
    if text.stop_string is None and delta.finished:
        text.finish(delta)
    if text.stop_string is not None:
        completion.finish_reason, completion.stop_reason = "stop", text.stop_string
    elif delta.finished:
        completion.finish_reason, completion.stop_reason = delta.finish_reason, delta.stop_reason
    else:
        return False
    completion.text, completion.token_ids = text.text, text.token_ids
    completion.logprobs = text.logprobs
    completion.cumulative_logprob = cumulative_logprob(text.token_ids, text.logprobs)
    choice.output.finished = all(c.finished() for c in choice.output.outputs)
    return True


def _absorb_prompt_side(output: RequestOutput, delta: RequestOutputDelta, tokenizer) -> None:
    """What a delta says of the prompt: its logprobs (once) and the prefix-cache hits."""
    if delta.prompt_logprobs is not None:
        output.prompt_logprobs = with_decoded_tokens(tokenizer, delta.prompt_logprobs)
    if delta.num_cached_tokens is not None:
        output.num_cached_tokens = delta.num_cached_tokens
