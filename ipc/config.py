"""The typed, frozen projections of ``engine.config.EngineConfig``.

``EngineConfig`` is the one owner of configuration: it validates every rule
before any process starts and builds these with its methods
(``runner_config``, ``scheduler_config``). They live here because both sides
import them (the engine builds them, the runner and the scheduler read them)
and the runner imports no package but ipc. They carry no rules and no defaults
of their own: every value here was checked, and every default chosen, by
``EngineConfig`` (tests and benchmarks build them through it too).
``RunnerConfig`` crosses the socket inside ``ControlCall`` as itself, with
the model's description, so a worker receives both typed.
"""

from __future__ import annotations

import msgspec

from ipc.model_config import ModelConfig

# The name of a model directory's GGUF weights (a link to the file):
# checkpoint/gguf_model.py writes it, runner/loader.py reads the weights by it.
GGUF_FILE = "model.gguf"


# The most drafts per step a request may verify: the fixed width of the
# runner's per-slot draft table and of the n-gram kernel's unrolled loops.
MAX_SPECULATIVE_TOKENS = 16
SPECULATIVE_METHODS = ("ngram", "draft_model")
# A pooling runner's sequence pooling of a decoder (``RunnerConfig.pooling_type``).
POOLING_TYPES = ("LAST", "MEAN", "CLS")
# vLLM's token-level pooling tasks: one output row a prompt token (the
# request's ``NewRequestData.pooling_task``; ``runner.pooler``).
TOKEN_POOLING_TASKS = ("token_embed", "token_classify")


class SpeculativeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Speculative decoding, as ``EngineConfig.speculative_config`` resolved it.

    ``method`` "ngram": prompt lookup over the request's own tokens, n-grams
    of ``prompt_lookup_max`` down to ``prompt_lookup_min`` tokens;
    "draft_model": the model at ``model`` (a local directory the workers
    read; ``draft_model_config`` its description) drafts. ``num_speculative_tokens`` (k) drafts per decode step,
    ``1 <= k <= MAX_SPECULATIVE_TOKENS``. ``disable_by_batch_size``: no
    drafts in a step that starts with at least this many running requests
    (None: always draft). ``draft_max_model_len`` (a draft model only):
    the draft model's limit, its ``max_position_embeddings`` at most the
    runner's ``max_model_len`` (``EngineConfig.draft_max_model_len``): only
    drafts made below it count.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 0
    prompt_lookup_min: int = 0
    model: str | None = None
    disable_by_batch_size: int | None = None
    draft_model_config: ModelConfig | None = None
    draft_max_model_len: int | None = None


class LoRAConfig(msgspec.Struct, frozen=True, kw_only=True):
    """LoRA serving (vLLM's names): ``max_loras`` adapters held on the device
    at once (the distinct adapters of a running batch), each of rank at most
    ``max_lora_rank``."""

    max_loras: int
    max_lora_rank: int


class ProfilerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The torch profiler's settings (vLLM's ``ProfilerConfig`` names):
    each worker writes its traces to ``torch_profiler_dir`` (an absolute
    path) between ``start_profile`` and ``stop_profile``
    (``worker.torch_profiler``)."""

    torch_profiler_dir: str
    torch_profiler_record_shapes: bool
    torch_profiler_with_memory: bool
    torch_profiler_with_stack: bool
    torch_profiler_with_flops: bool
    torch_profiler_use_gzip: bool
    torch_profiler_dump_cuda_time_total: bool


class RunnerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a worker needs to build its runner.

    ``model`` is a local directory the worker reads weights from;
    ``model_config`` describes the model (the runner reads no config file);
    ``device`` is "cpu" or "cuda" and ``dtype`` a torch dtype name, both
    resolved. ``max_num_seqs`` is the number of request slots (rows
    of every persistent tensor); ``max_num_batched_tokens`` sizes the
    per-step input buffers; ``max_model_len`` sizes ``all_token_ids`` and the
    block tables (under the engine's "auto", -1, the model's positions: the
    length the engine decides once the cache is sized is never longer);
    ``block_size`` is a power of two. ``kv_cache_memory_bytes``
    bounds the KV cache on CPU; ``gpu_memory_utilization`` is the share of
    the GPU the worker may use. ``disable_custom_all_reduce``: NCCL for
    every all-reduce instead of the one-shot kernel over peer memory.
    ``load_format="dummy"`` fills random weights
    instead of reading the checkpoint. ``speculative``: speculative
    decoding, None when off. ``logits_processors``: qualified names of
    custom logits processor classes (``runner.sampling.logits_processor``)
    that each worker imports and constructs; empty: none.
    ``logits_processor_folders``: the folders the engine imported their
    modules from, which a worker appends to its import path first (a worker
    daemon's path lacks the caller's folder, e.g. its script's).
    ``pooling_type``: None for a generating runner; "LAST", "MEAN" or "CLS"
    for a pooling runner (vLLM's ``runner="pooling"``), which samples
    nothing and pools each request's final-normed hidden states once its
    prompt has run (``runner.pooler``). ``pooling_task``: a pooling
    runner's task, "embed" (the pooled hidden state is the output) or
    "classify" (the model has a score head instead of the LM head, and the
    output is the pooled row's ``num_labels`` logits); None for a
    generating runner.
    ``lora``: LoRA serving, None when off (the model and the step are then
    exactly those without LoRA). ``profiler``: the worker's torch profiler
    settings, None when profiling is off (``start_profile`` is then refused).
    """

    model: str
    model_config: ModelConfig
    device: str
    dtype: str
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    seed: int
    enforce_eager: bool
    max_cudagraph_capture_size: int | None
    max_prefill_cudagraph_tokens: int
    disable_custom_all_reduce: bool
    attention_backend: str | None
    kv_cache_memory_bytes: int
    gpu_memory_utilization: float
    load_format: str
    speculative: SpeculativeConfig | None
    logits_processors: list[str] = []
    logits_processor_folders: list[str] = []
    pooling_type: str | None = None
    pooling_task: str | None = None
    lora: LoRAConfig | None = None
    profiler: ProfilerConfig | None = None

    @property
    def num_speculative_tokens(self) -> int:
        return 0 if self.speculative is None else self.speculative.num_speculative_tokens

    @property
    def max_num_blocks_per_req(self) -> int:
        return -(-self.max_model_len // self.block_size)


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler's limits. ``num_blocks`` is what the workers reported
    (the minimum over ranks). ``policy``: "fcfs" (arrival order) or
    "priority" (lower ``Request.priority`` first, then arrival).
    ``enable_prefix_caching``: reuse KV blocks of equal token prefixes;
    hits reach the runner as ``NewRequestData.num_computed_tokens``.
    ``enable_chunked_prefill`` False: a prompt is admitted only when the
    step's budget holds all of it (MEAN or CLS pooling reads its first
    chunk's tokens; ``max_num_batched_tokens >= max_model_len`` then).
    ``max_model_len`` >= 2 (a prompt must leave room for one token).
    ``max_logprobs``: top logprobs per token a request may ask for (-1: any).
    ``num_speculative_tokens``: drafts a decoding request verifies per step
    (0: speculative decoding off); none in a step that starts with at least
    ``spec_disable_by_batch_size`` running requests (0: no such limit).
    ``draft_max_model_len`` <= ``max_model_len``: no draft is verified at a
    position at or past it (a draft model's positions; ``max_model_len``
    where nothing else bounds drafts). ``vocab_size``: the model's token
    ids are ``0 .. vocab_size - 1`` (the drafts a step's output reports
    are checked against it). ``pooled_size``: the float32 values of each
    pooled vector a step's output reports, the model's hidden size (its
    ``num_labels`` for the "classify" task), for a pooling engine (``RunnerConfig.pooling_type`` set); 0 for a generating
    one, whose outputs report none. ``max_loras``: adapter slots on the
    workers (0: LoRA off), so at most that many distinct adapters run at
    once. ``classifier_activation``: the activation a classifier's outputs
    take (``engine.classify_head``'s names)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_blocks: int
    policy: str
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    max_logprobs: int
    num_speculative_tokens: int
    spec_disable_by_batch_size: int
    draft_max_model_len: int
    vocab_size: int
    pooled_size: int
    max_loras: int = 0
    classifier_activation: str = "classify"


# Sleep mode (vLLM's names): the levels ``sleep`` takes and the tags of the
# memory ``wake_up`` restores (runner/sleep_mode.py says what each frees).
SLEEP_LEVELS = (1, 2)
SLEEP_TAGS = ("weights", "kv_cache")

# The values a ``ControlCall`` argument may take: a union msgspec decodes
# without guessing (one structured type, the rest scalars and lists).
ControlArg = RunnerConfig | int | float | str | bool | list | None
