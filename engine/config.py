"""The engine's configuration: vLLM's names, the one owner of every rule.

``EngineConfig`` is what ``LLM(...)`` and the CLI accept (the CLI's engine
options are generated from its fields and their help texts). It checks every
rule the arguments alone decide on construction, and in ``check_model`` /
``check_machine`` every rule the model's description (``ModelConfig``, whose
own rules are the model's shapes) and the machine decide for these
arguments; the engine calls both before any worker starts. The runner and the
scheduler receive typed, frozen projections built here (``runner_config``,
``scheduler_config``), which carry no rules of their own.

Adding a setting: one field below (default, help text) plus its use; the
CLI option follows from the field. A runner setting is also declared, by the
same name and with its type only, in ``ipc.config.RunnerConfig`` (the
worker decodes it typed); ``runner_config`` copies it by name.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import socket
from dataclasses import dataclass, field, fields

import msgspec

from engine.classify_head import CLASSIFY, classifier_activation
from engine.json_option import json_object
from engine.pooler_config import CONVERTS, RUNNERS, PoolerSettings, resolve_pooler
from engine.profiler_config import parse_profiler_config
from engine.reasoning import REASONING_PARSERS
from ipc.config import (
    MAX_SPECULATIVE_TOKENS,
    SPECULATIVE_METHODS,
    LoRAConfig,
    ProfilerConfig,
    RunnerConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from ipc.endpoints import (
    SOCKET_NAMES,
    bind_error,
    check_private_directory,
    check_socket_paths,
)
from ipc.model_config import DTYPE_ALIASES, MODEL_DTYPES, ModelConfig

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", *MODEL_DTYPES, *DTYPE_ALIASES)
ATTENTION_BACKENDS = ("torch", "sdpa", "triton", "flash_attn", "triton_flash_prefill")
SCHEDULING_POLICIES = ("fcfs", "priority")
# Besides these, generation_config may name a folder that holds a generation_config.json.
GENERATION_CONFIGS = ("auto", "vllm")
# vLLM's kv_cache_dtype names of the dtypes tprun keeps a KV cache in (the model's).
KV_CACHE_DTYPE_NAMES = ("float16", "bfloat16")
# vLLM's "safetensors" (a model directory) and "gguf" (a .gguf file) are what "auto" loads.
LOAD_FORMATS = ("auto", "dummy", "safetensors", "gguf")
# vLLM's allowed max_lora_rank values (its LoRAConfig's MaxLoRARanks).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM's max_model_len -1 ("auto" on the command line): the longest length the
# KV cache holds, at most the model's positions, decided once the cache is sized.
AUTO_MAX_MODEL_LEN = -1


class ConfigError(ValueError):
    """A setting that cannot work with these arguments, this model or this
    machine; raised before any worker starts (the CLI exits with code 2)."""


def _opt(default, help: str, **cli):
    """A field with its CLI help text. ``cli`` may name ``flag`` (another
    option name), ``aliases`` (more option names, e.g. vLLM's short ones),
    ``metavar``, ``choices``, ``given_only=True`` (the option has no default
    of its own: the CLI resolves it when it is left out), or ``cli=False``
    (no option: the CLI sets it from elsewhere)."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass(frozen=True)
class EngineConfig:
    """``executor`` None picks "uni" (in process) at TP=1 and "mp" (worker
    daemons) above, or "mp" when ``attach_workers_dir`` is set."""

    model: str = _opt("tiny", "'tiny', a local model directory or a .gguf file "
                      "(pkg:PACKAGE/FILE for one inside an installed package); a Hugging Face "
                      "hub id needs a local download first")
    tensor_parallel_size: int = _opt(1, "tensor-parallel ranks: vLLM's spelling of tprun's "
                                     "--nproc-per-node (default: that option's value)",
                                     aliases=("-tp",), given_only=True)
    device: str = _opt("auto", "'auto' picks CUDA when available", choices=DEVICES)
    dtype: str = _opt("auto", "weights and activations; 'auto' takes the checkpoint's",
                      choices=DTYPES)
    block_size: int = _opt(16, "tokens per KV cache block (a power of two)")
    max_num_seqs: int = _opt(256, "requests in one step at most")
    max_num_batched_tokens: int | None = _opt(None, "tokens in one step at most (default: "
                                              "8192 on CUDA, 2048 elsewhere)")
    max_model_len: int | None = _opt(None, "prompt + output tokens per request at most "
                                     "(default: the model's max_position_embeddings); -1 or "
                                     "'auto': the longest the KV cache holds, at most that",
                                     metavar="N|auto")
    num_gpu_blocks_override: int | None = _opt(None, "KV cache blocks, instead of what "
                                               "fits in memory")
    enforce_eager: bool = _opt(False, "no CUDA graphs")
    enable_sleep_mode: bool = _opt(False, "allow LLM.sleep / wake_up (and the server's /sleep, "
                                   "/wake_up routes): free the weights and KV cache "
                                   "between workloads")
    max_cudagraph_capture_size: int | None = _opt(
        None, "largest decode batch captured as a CUDA graph; larger ones run eagerly "
        "(default: min(max_num_seqs, max_num_batched_tokens), at most 1024)")
    max_prefill_cudagraph_tokens: int = _opt(
        2048, "largest batch with prefills, in tokens, replayed from a CUDA graph (token "
        "counts padded up a ladder); larger ones run eagerly; 0: prefills always eager")
    disable_custom_all_reduce: bool = _opt(False, "NCCL for every all-reduce instead of the "
                                           "one-shot kernel over peer memory")
    seed: int = _opt(0, "seed of the weights of dummy models and of unseeded sampling")
    attention_backend: str | None = _opt(None, "default: 'triton' on CUDA, 'sdpa' elsewhere",
                                         choices=ATTENTION_BACKENDS)
    gpu_memory_utilization: float = _opt(0.9, "share of each GPU's memory a worker may use")
    kv_cache_memory_bytes: int = _opt(1 << 30, "KV cache bytes per worker on CPU")
    load_format: str = _opt("auto", "'dummy': random weights of the model's shapes; vLLM's "
                            "'safetensors' (a model directory) and 'gguf' (a .gguf file) are "
                            "what 'auto' loads", choices=LOAD_FORMATS)
    step_timeout_s: float = _opt(300.0, "seconds a step may take before the engine names "
                                 "the stuck ranks", flag="--step-timeout",
                                 metavar="SECONDS")
    executor: str | None = _opt(None, "'mp' (worker daemons) or 'uni' (in process, TP=1)",
                                choices=("mp", "uni"), cli=False)
    attach_workers_dir: str | None = _opt(
        None, "do not spawn workers: bind ipc://DIR/broadcast, ipc://DIR/reply and "
        "ipc://DIR/output (DIR private to you, created if missing) and wait for workers "
        "started elsewhere, e.g. torchrun --nproc-per-node N -m worker --broadcast "
        "ipc://DIR/broadcast --reply ipc://DIR/reply --output ipc://DIR/output",
        flag="--attach-workers", metavar="DIR")
    master_addr: str = _opt("127.0.0.1", "the process group's rendezvous address", cli=False)
    master_port: int | None = _opt(None, "the rendezvous port (default: a free one)", cli=False)
    async_scheduling: bool = _opt(True, "send step N+1 before step N's output arrives "
                                  "(--no-async-scheduling: one step at a time)")
    enable_prefix_caching: bool = _opt(True, "reuse KV blocks of equal prompt prefixes")
    max_logprobs: int = _opt(20, "top logprobs per token a request may ask for at most "
                             "(-1: no limit, which a request's -1, the whole vocabulary, "
                             "needs; 20 is OpenAI's)")
    scheduling_policy: str = _opt("fcfs", "'fcfs': arrival order; 'priority': lower "
                                  "request priority first, then arrival",
                                  choices=SCHEDULING_POLICIES)
    generation_config: str = _opt("auto", "'auto': the model's generation_config.json gives "
                                  "the sampling defaults (temperature, top_p, top_k, min_p, "
                                  "repetition_penalty; max_new_tokens caps max_tokens) where a "
                                  "request leaves them unset, as vLLM's; 'vllm': tprun's own "
                                  "(the model's eos_token_id there still ends outputs, as in "
                                  "vLLM); a folder: the generation_config.json in it gives "
                                  "them",
                                  metavar="auto|vllm|FOLDER")
    speculative_config: dict | str | None = _opt(
        None, "speculative decoding, as vLLM spells it (a JSON object on the command line): "
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
        '"prompt_lookup_min": 2} or {"method": "draft_model", "model": PATH, '
        f'"num_speculative_tokens": 3}}; num_speculative_tokens <= {MAX_SPECULATIVE_TOKENS}. '
        "Off by default", metavar="JSON")
    logits_processors: list | None = _opt(
        None, "custom logits processors (vLLM's): qualified class names, 'module:Class' or "
        "'module.Class', of subclasses of runner.sampling.logits_processor.LogitsProcessor "
        "(LLM also takes the classes); each worker imports and constructs them; refused with "
        "speculative decoding", nargs="+", metavar="NAME")
    enable_lora: bool = _opt(False, "serve LoRA adapters (PEFT format) that requests name "
                             "(vLLM's LoRARequest); off, the model runs with no LoRA work at all")
    max_loras: int = _opt(1, "LoRA adapters held on the device at once: the distinct adapters "
                          "of one running batch at most")
    max_lora_rank: int = _opt(16, "largest LoRA rank an adapter may have (the device buffers "
                              "are padded to it): one of vLLM's "
                              f"{', '.join(map(str, MAX_LORA_RANKS))}")
    # vLLM's options for what tprun does not do: each takes only the values
    # that ask for what tprun does (or that change nothing in vLLM's engine
    # either); any other value is refused by name (``_check_vllm_options``).
    trust_remote_code: bool = _opt(False, "taken as vLLM takes it; changes nothing: tprun runs "
                                   "no code of a model's")
    tokenizer: str | None = _opt(None, "the tokenizer is the model's own (tokenizer.json, or "
                                 "the GGUF file's); only the model's path is taken")
    revision: str | None = _opt(None, "refused: tprun loads local files and picks no "
                                "revision (check it out, then give its directory)")
    download_dir: str | None = _opt(None, "refused: tprun downloads nothing (download the "
                                    "model, then give its directory)")
    quantization: str | None = _opt(None, "refused: tprun has no quantized kernels; 'gguf' "
                                     "is taken for a .gguf model, whose weights are "
                                     "dequantized on load", aliases=("-q",))
    kv_cache_dtype: str = _opt("auto", "'auto', or vLLM's name of the dtype the KV cache is "
                               "kept in: the model's (after --dtype), 'bfloat16' or 'float16'")
    swap_space: float = _opt(4.0, "GiB; no effect, as in vLLM's V1 engine: a preempted request "
                             "is recomputed, never swapped to the CPU")
    max_seq_len_to_capture: int | None = _opt(None, "no effect: CUDA graphs cover every "
                                              "sequence length (see "
                                              "--max-cudagraph-capture-size)")
    structured_outputs_config: dict | str | None = _opt(
        None, 'vLLM\'s (a JSON object on the command line): {"backend": "auto" or "guidance"} '
        '(tprun\'s grammars are llguidance\'s, vLLM\'s "guidance" backend), '
        '"disable_fallback" (no effect: one backend) and "disable_any_whitespace": false; '
        "anything else is refused", metavar="JSON")
    reasoning_parser: str | None = _opt(
        None, "the model's reasoning syntax, as vLLM names it: deepseek_r1 or qwen3 (both "
        "<think>...</think>, which the tokenizer must hold as tokens); a structured-output "
        "grammar then holds from the end of the reasoning on, and the HTTP server answers the "
        "reasoning in its own field (default: none)", metavar="NAME")
    runner: str = _opt("auto", "vLLM's: 'pooling' serves embeddings (LLM.embed, "
                       "/v1/embeddings) instead of generating, or class probabilities for a "
                       "sequence classifier's checkpoint; 'auto' generates, except with such "
                       "a checkpoint; 'generate' generates", choices=RUNNERS)
    convert: str = _opt("auto", "vLLM's: 'embed' makes the decoder an embedding model, "
                        "'classify' a classifier (LLM.classify, /classify) with the "
                        "checkpoint's score.weight (runner 'pooling')", choices=CONVERTS)
    pooler_config: dict | str | None = _opt(
        None, 'a pooling model\'s pooler, as vLLM spells it (a JSON object on the command '
        'line): {"pooling_type": "LAST" (default), "MEAN" or "CLS", "normalize": true, '
        '"dimensions": N, "use_activation": true}; MEAN and CLS run each prompt whole in '
        "one step, without prefix caching, as in vLLM", metavar="JSON")
    profiler_config: dict | str | None = _opt(
        None, 'vLLM\'s (a JSON object on the command line): {"profiler": "torch", '
        '"torch_profiler_dir": DIR} turns on LLM.start_profile()/stop_profile() and serve\'s '
        "POST /start_profile and /stop_profile: every worker writes a torch profiler trace "
        "under DIR, named with its rank; the torch_profiler_* switches (record_shapes, "
        "with_memory, with_stack, with_flops, use_gzip, dump_cuda_time_total) as vLLM's "
        "(default: off)", metavar="JSON")
    data_parallel_rank: int = _opt(0, "this engine's data-parallel replica (trace names)",
                                   cli=False)
    disable_log_stats: bool = _opt(True, "no periodic stats line", cli=False)
    log_stats_interval_s: float = _opt(10.0, "seconds between stats lines", cli=False)

    def __post_init__(self) -> None:
        """Every rule the arguments alone decide."""
        if not self.model or not isinstance(self.model, str):
            raise ConfigError(f"model must name 'tiny', a local model directory or a .gguf "
                              f"file, got {self.model!r}")
        _check_ints(self)
        _check_max_lora_rank(self.max_lora_rank)
        _check_choices(self)
        _check_vllm_options(self)
        _check_generation_config(self.generation_config)
        _check_reasoning_parser(self.reasoning_parser)
        if self.dtype in DTYPE_ALIASES:
            object.__setattr__(self, "dtype", DTYPE_ALIASES[self.dtype])
        if self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two, got {self.block_size}")
        _check_max_model_len(self.max_model_len)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError("gpu_memory_utilization must be in (0, 1], got "
                              f"{self.gpu_memory_utilization}")
        for name in ("step_timeout_s", "log_stats_interval_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not _is_int(self.max_logprobs, -1):
            raise ConfigError(f"max_logprobs must be an int >= -1, got {self.max_logprobs!r}")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ConfigError(f"master_port must be in 1..65535, got {self.master_port}")
        if self.executor == "uni" and self.attach_workers_dir is not None:
            raise ConfigError("attach_workers_dir needs executor 'mp'")
        if self.executor == "uni" and self.tensor_parallel_size != 1:
            raise ConfigError("executor 'uni' runs TP=1 only")
        spec = self.speculative
        _check_logits_processors(self)
        _check_pooling(self)
        self.profiler  # noqa: B018 (checked here, before any process starts)
        if not _is_int(self.data_parallel_rank, 0):
            raise ConfigError(f"data_parallel_rank must be an int >= 0, got "
                              f"{self.data_parallel_rank!r}")
        if spec is not None and self.resolved_device == "cuda" and self.attention_backend in (
                "torch", "sdpa"):
            raise ConfigError(f"speculative decoding on CUDA needs the 'triton' or 'flash_attn' "
                              f"attention backend, not {self.attention_backend!r} (it reads "
                              "exact sequence lengths on the host, which drafts in flight "
                              "leave unknown)")

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """``speculative_config`` checked and resolved (None: off)."""
        return parse_speculative_config(self.speculative_config)

    @property
    def profiler(self) -> ProfilerConfig | None:
        """``profiler_config`` checked and resolved (None: profiling off)."""
        try:
            return parse_profiler_config(self.profiler_config)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    @property
    def pooler(self) -> PoolerSettings | None:
        """``runner`` / ``convert`` / ``pooler_config`` resolved, before the
        model is known: the pooling settings of a pooling engine, None where
        the options alone make none (``pooler_for`` decides for a model)."""
        return self.pooler_for(None)

    def pooler_for(self, model: ModelConfig | None) -> PoolerSettings | None:
        """The pooling settings of an engine serving ``model`` (a sequence
        classifier's checkpoint pools under runner "auto" too, with the
        "classify" task); None for a generating one."""
        try:
            return resolve_pooler(self.runner, self.convert, self.pooler_config,
                                  None if model is None else model.architecture)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def max_num_batched_tokens_for(self, model: ModelConfig) -> int:
        """``resolved_max_num_batched_tokens``; where every prompt runs whole
        (MEAN or CLS pooling, no chunked prefill) at least the longest
        prompt, ``resolved_max_model_len``, as vLLM raises its default
        without chunked prefill (a smaller one given is refused:
        ``check_model``)."""
        tokens = self.resolved_max_num_batched_tokens
        pooler = self.pooler_for(model)
        if pooler is not None and pooler.whole_prompts and self.max_num_batched_tokens is None:
            tokens = max(tokens, self.resolved_max_model_len(model))
        return tokens

    @property
    def lora_config(self) -> LoRAConfig | None:
        """The workers' LoRA settings (None: LoRA off)."""
        if not self.enable_lora:
            return None
        return LoRAConfig(max_loras=self.max_loras, max_lora_rank=self.max_lora_rank)

    @property
    def resolved_reasoning_parser(self) -> str | None:
        """``reasoning_parser``, else the one ``structured_outputs_config``
        names (vLLM's place for it; where both name one, the option wins,
        as in vLLM). None: no reasoning parser."""
        if self.reasoning_parser is not None:
            return self.reasoning_parser
        so = self.structured_outputs_config
        return (_json_object(so, "structured_outputs_config").get("reasoning_parser") or None
                if so is not None else None)

    # ---- rules of the model and the machine ------------------------------
    def check_model(self, model: ModelConfig) -> None:
        """Every rule the model decides for these arguments: a
        ``kv_cache_dtype`` that names the dtype the cache is kept in,
        ``_check_pooling``'s rules where the checkpoint makes a pooling
        model (a sequence classifier under runner "auto"), a classifier's
        activation that loads (``classifier_activation``), and
        ``check_shapes``."""
        dtype = self.resolved_dtype(model)
        if self.kv_cache_dtype not in ("auto", dtype):
            taken = "'auto'" + (f" or {dtype!r}" if dtype in KV_CACHE_DTYPE_NAMES else "")
            raise ConfigError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported: tprun "
                              f"keeps the KV cache in the model's dtype, {dtype} here (dtype); "
                              f"only {taken} is taken")
        pooler = self.pooler_for(model)
        if pooler is not None:
            _check_pooling(self, pooler)
        if pooler is not None and pooler.task == "classify":
            self.classifier_activation(model)
        if pooler is not None and pooler.whole_prompts:
            tokens, length = self.max_num_batched_tokens_for(model), self.resolved_max_model_len(model)
            if tokens < length:
                raise ConfigError(
                    f"max_num_batched_tokens ({tokens}) is smaller than max_model_len ({length}): "
                    f"{pooler.pooling_type} pooling runs each prompt whole (no chunked prefill), "
                    "so longer prompts could never run; raise max_num_batched_tokens or lower "
                    "max_model_len")
        self.check_shapes(model)

    def check_shapes(self, model: ModelConfig) -> None:
        """Heads and MLP columns that split over the ranks, a length (and,
        with ``num_gpu_blocks_override``, a cache that holds it)."""
        try:
            model.check_tensor_parallel(self.tensor_parallel_size, self.model)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.resolved_max_model_len(model)
        blocks = self.num_gpu_blocks_override
        if blocks is not None:
            self.check_kv_cache(blocks, self.max_model_len_for(model, blocks))

    def max_model_len_for(self, model: ModelConfig, num_blocks: int) -> int:
        """The length requests get once the KV cache has ``num_blocks``
        blocks. ``max_model_len`` -1 ("auto"): as vLLM decides it, the
        longest the cache holds (``num_blocks * block_size`` tokens: a
        request of that many needs every block), at most the model's
        positions; ConfigError where that leaves less than a prompt token
        and an output token. Any other: ``resolved_max_model_len`` (which
        the cache must hold: ``check_kv_cache``). A draft model's positions
        bound only where it drafts (``draft_max_model_len``), never this."""
        longest = self.resolved_max_model_len(model)
        if self.max_model_len != AUTO_MAX_MODEL_LEN:
            return longest
        tokens = num_blocks * self.block_size
        if tokens < 2:
            raise ConfigError(f"max_model_len auto: the KV cache holds {tokens} token "
                              f"({num_blocks} block of {self.block_size}), fewer than a prompt "
                              f"token and an output token: raise {self._cache_size_option}")
        return min(longest, tokens)

    def check_kv_cache(self, num_blocks: int, max_model_len: int) -> None:
        """The KV cache holds one request of ``max_model_len`` tokens (as vLLM
        requires at start): else a request without ``max_tokens``, whose
        default runs to that length, could never be admitted."""
        tokens = num_blocks * self.block_size
        if tokens >= max_model_len:
            return
        fix = f"raise {self._cache_size_option}"
        if tokens >= 2:
            fix = (f"set max_model_len to at most {tokens}, or {fix} (max_model_len -1, "
                   "'auto': the longest the cache holds)")
        raise ConfigError(f"the KV cache holds {tokens} tokens ({num_blocks} blocks of "
                          f"{self.block_size}), fewer than max_model_len {max_model_len}: "
                          f"{fix}")

    @property
    def _cache_size_option(self) -> str:
        """The option that sizes the KV cache here."""
        if self.num_gpu_blocks_override is not None:
            return "num_gpu_blocks_override"
        return "gpu_memory_utilization" if self.resolved_device == "cuda" else (
            "kv_cache_memory_bytes")

    def check_draft_model(self, info: ModelConfig, draft: ModelConfig) -> None:
        """A draft model (speculative method "draft_model") has the target's
        vocabulary and is sharded like it: its heads and MLP split over the
        ranks as the target's must. Its positions may be fewer than
        ``max_model_len``: they bound where it drafts
        (``draft_max_model_len``), not the length requests get."""
        spec = self.speculative
        name = f"draft model {spec.model!r}"
        if draft.vocab_size != info.vocab_size:
            raise ConfigError(f"speculative_config: {name} has a vocabulary "
                              f"of {draft.vocab_size} tokens, the target {info.vocab_size}; "
                              "they must be the same")
        try:
            draft.check_tensor_parallel(self.tensor_parallel_size, name)
        except ValueError as e:
            raise ConfigError(f"speculative_config: {e}") from None

    def draft_max_model_len(self, draft: ModelConfig | None, max_model_len: int) -> int:
        """The longest a request's tokens and drafts may reach while it
        drafts, with ``max_model_len`` the length requests get: as vLLM caps
        a draft model's own length, the ``draft`` model's
        ``max_position_embeddings`` (its config's, or its GGUF's context
        length), at most ``max_model_len``; ``max_model_len`` itself where
        nothing else bounds drafts (n-gram drafts, or a draft whose config
        gives no positions). A request past it decodes on, without drafts
        (``Scheduler._num_drafts``): no draft at or past it is verified, so
        none was made where the draft model has no position
        (``DraftModelProposer``)."""
        positions = None if draft is None else draft.max_position_embeddings
        return max_model_len if positions is None else min(positions, max_model_len)

    def check_machine(self) -> None:
        """Every rule the machine decides: an attention backend its device
        runs, a profiler's trace directory that is not a file, an
        ``attach_workers_dir`` that is missing or private to this user
        and short enough for its sockets' addresses,
        a rendezvous the spawned ranks can meet at (``_check_rendezvous``), CUDA
        present and enough devices for the ranks this host spawns, whether
        CUDA was asked for or
        ``auto`` chose it (``auto`` never falls back to the CPU for want of
        devices: a model sized for GPUs would then run on the host unasked)."""
        self._check_attention_backend()
        profiler = self.profiler
        if profiler is not None and os.path.exists(profiler.torch_profiler_dir) and \
                not os.path.isdir(profiler.torch_profiler_dir):
            raise ConfigError(f"profiler_config: torch_profiler_dir "
                              f"{profiler.torch_profiler_dir} is not a directory")
        if self.attach_workers_dir is not None:
            try:
                check_private_directory(self.attach_workers_dir)
            except ValueError as e:
                raise ConfigError(f"attach_workers_dir {e}") from None
            try:
                check_socket_paths(self.attach_workers_dir, *SOCKET_NAMES)
            except ValueError as e:
                raise ConfigError(f"attach_workers_dir: {e}") from None
        if self.resolved_executor == "mp":
            self._check_rendezvous()
        if self.resolved_device != "cuda":
            return
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda, but CUDA is not available on this machine "
                              "(use --device cpu)")
        count = torch.cuda.device_count()
        if self.attach_workers_dir is None and self.tensor_parallel_size > count:
            raise ConfigError(f"tensor-parallel size {self.tensor_parallel_size} needs as many "
                              f"CUDA devices; this machine has {count} (use --device cpu "
                              "to run the ranks on the CPU)")

    def _check_rendezvous(self) -> None:
        """``master_addr`` resolves (the workers' MASTER_ADDR). Where the
        executor spawns ranks that form a group (TP > 1), it serves their
        store at ``master_addr:master_port`` (executor/rendezvous.py), so
        the address must be this machine's and a given port free: else the
        store fails to listen (a traceback), or, at an address of another
        machine, waits minutes to reach itself."""
        port = self.master_port or 0
        try:
            addresses = socket.getaddrinfo(self.master_addr, port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise ConfigError(f"master_addr {self.master_addr!r} does not resolve "
                              f"({e.strerror or e})") from None
        if self.attach_workers_dir is not None or self.tensor_parallel_size == 1:
            return
        error = bind_error(addresses)
        if error is None:
            return
        if error.errno == errno.EADDRINUSE:
            raise ConfigError(f"master_port {port}: cannot listen on {self.master_addr}:{port} "
                              f"({error.strerror}); give a free port, or none for any free one")
        raise ConfigError(f"master_addr {self.master_addr!r} is not an address of this machine "
                          f"({error.strerror}); the ranks tprun spawns meet here: leave it out "
                          "(127.0.0.1)")

    def _check_attention_backend(self) -> None:
        """The Triton backends compile for CUDA (on the CPU they run only
        under Triton's interpreter, ``TRITON_INTERPRET=1``, which the tests
        use); flash-attn needs CUDA and its package."""
        name = self.attention_backend
        if name == "flash_attn":
            if self.resolved_device != "cuda":
                raise ConfigError("attention backend 'flash_attn' runs on CUDA only "
                                  "(on the CPU: 'sdpa' or 'torch')")
            if importlib.util.find_spec("flash_attn") is None:
                raise ConfigError("attention backend 'flash_attn' needs the flash-attn "
                                  "package, which is not installed")
        elif (name in ("triton", "triton_flash_prefill") and self.resolved_device != "cuda"
              and os.environ.get("TRITON_INTERPRET") != "1"):
            raise ConfigError(f"attention backend {name!r} runs on CUDA (on the CPU: 'sdpa' "
                              "or 'torch'; or Triton's interpreter, TRITON_INTERPRET=1)")

    # ---- resolved values and projections ---------------------------------
    @property
    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def resolved_executor(self) -> str:
        if self.executor is not None:
            return self.executor
        if self.attach_workers_dir is not None:
            return "mp"
        return "uni" if self.tensor_parallel_size == 1 else "mp"

    @property
    def resolved_max_num_batched_tokens(self) -> int:
        """The step's token budget. On CUDA 8192 (as vLLM's default for GPUs):
        an eager prefill step has a host cost (the Python and kernel launches
        of every layer) that a 2048-token step no longer hides behind its
        device time once tensor parallelism splits that work; 2048 elsewhere."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 8192 if self.resolved_device == "cuda" else 2048

    def resolved_max_model_len(self, model: ModelConfig) -> int:
        """``max_model_len``, else (None, or -1 before the KV cache decides:
        ``max_model_len_for``) the model's ``max_position_embeddings``: the
        length the runner's tables and rotary cache are sized for. Longer
        than the model's positions is refused (as vLLM does): its rotary
        tables end there, and a longer prompt would fail mid-step."""
        length = model.max_position_embeddings
        if self.max_model_len not in (None, AUTO_MAX_MODEL_LEN):
            if length is not None and self.max_model_len > length:
                raise ConfigError(f"max_model_len {self.max_model_len} is longer than "
                                  f"{self.model}'s {length} positions "
                                  "(max_position_embeddings)")
            return self.max_model_len
        if length is None or length < 2:
            raise ConfigError(f"{self.model}'s config gives no usable max_position_embeddings "
                              f"({length!r}); set max_model_len")
        return length

    def resolved_dtype(self, model: ModelConfig) -> str:
        """``dtype``, with "auto" the checkpoint's."""
        return model.dtype if self.dtype == "auto" else self.dtype

    def runner_config(self, model_dir: str, model: ModelConfig, draft_dir: str | None = None,
                      draft: ModelConfig | None = None) -> RunnerConfig:
        """Every ``RunnerConfig`` field is this config's field of the same
        name, except those resolved here: a runner setting is declared in
        both (its default and help text here, its wire type there), once.
        ``draft_dir`` and ``draft``: the draft model's directory as the
        workers read it and its description (speculative method
        "draft_model")."""
        spec = self.speculative
        length = self.resolved_max_model_len(model)
        pooler = self.pooler_for(model)
        if spec is not None and draft_dir is not None:
            spec = msgspec.structs.replace(
                spec, model=draft_dir, draft_model_config=draft,
                draft_max_model_len=self.draft_max_model_len(draft, length))
        resolved = dict(
            model=model_dir, model_config=model, device=self.resolved_device,
            dtype=self.resolved_dtype(model),
            max_num_batched_tokens=self.max_num_batched_tokens_for(model),
            max_model_len=length, speculative=spec,
            logits_processors=list(self.logits_processors or ()),
            logits_processor_folders=_import_folders(self.logits_processors or ()),
            pooling_type=None if pooler is None else pooler.pooling_type,
            pooling_task=None if pooler is None else pooler.task,
            lora=self.lora_config, profiler=self.profiler,
        )
        same = {name: getattr(self, name) for name in RunnerConfig.__struct_fields__
                if name not in resolved}
        return RunnerConfig(**same, **resolved)

    def scheduler_config(self, model: ModelConfig, num_blocks: int,
                         draft: ModelConfig | None = None) -> SchedulerConfig:
        """The scheduler's limits for a KV cache of ``num_blocks`` blocks:
        its ``max_model_len`` is ``max_model_len_for``'s, its
        ``draft_max_model_len`` the ``draft`` model's bound within that
        (``draft_max_model_len``; the ``draft`` None where no draft model
        drafts)."""
        length = self.max_model_len_for(model, num_blocks)
        pooler = self.pooler_for(model)
        whole_prompts = pooler is not None and pooler.whole_prompts
        activation = (self.classifier_activation(model)
                      if pooler is not None and pooler.task == "classify" else CLASSIFY)
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens_for(model),
            max_model_len=length, block_size=self.block_size,
            num_blocks=num_blocks, policy=self.scheduling_policy,
            enable_prefix_caching=self.enable_prefix_caching and not whole_prompts,
            enable_chunked_prefill=not whole_prompts, max_logprobs=self.max_logprobs,
            num_speculative_tokens=0 if self.speculative is None
            else self.speculative.num_speculative_tokens,
            spec_disable_by_batch_size=0 if self.speculative is None
            else self.speculative.disable_by_batch_size or 0,
            draft_max_model_len=self.draft_max_model_len(draft, length),
            vocab_size=model.vocab_size,
            pooled_size=(0 if pooler is None else model.num_labels if pooler.task == "classify"
                         else model.hidden_size),
            max_loras=self.max_loras if self.enable_lora else 0,
            classifier_activation=activation,
        )

    def classifier_activation(self, model: ModelConfig) -> str:
        """The activation of ``model``'s classifications and cross-encoder
        scores (``engine.classify_head.classifier_activation``, from
        config.json's ``problem_type`` and sentence-transformers
        activation); a ``ConfigError`` where that activation cannot be
        loaded or fails on the logits."""
        try:
            return classifier_activation(model.problem_type,
                                         model.sentence_transformers_activation,
                                         model.num_labels)
        except ValueError as e:
            raise ConfigError(f"{self.model}: {e}") from None


_POSITIVE_INTS = ("tensor_parallel_size", "block_size", "max_num_seqs",
                  "kv_cache_memory_bytes", "max_loras", "max_lora_rank")
_OPTIONAL_POSITIVE_INTS = ("max_num_batched_tokens", "num_gpu_blocks_override",
                           "master_port", "max_cudagraph_capture_size", "max_seq_len_to_capture")
_NUMBERS = ("gpu_memory_utilization", "step_timeout_s", "log_stats_interval_s")
_BOOLS = ("enforce_eager", "enable_sleep_mode", "disable_custom_all_reduce", "async_scheduling",
          "enable_prefix_caching", "disable_log_stats", "trust_remote_code", "enable_lora")


# Every count crosses a socket as a signed 64-bit integer (msgspec's bound).
_INT_LIMIT = 1 << 63


def _is_int(value, low: int) -> bool:
    """An int (not a bool) in ``[low, 2**63)``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < _INT_LIMIT


def _check_ints(c: EngineConfig) -> None:
    value = c.max_prefill_cudagraph_tokens
    if not _is_int(value, 0):
        raise ConfigError(f"max_prefill_cudagraph_tokens must be an int >= 0 (below 2**63), "
                          f"got {value!r}")
    for name in _POSITIVE_INTS + _OPTIONAL_POSITIVE_INTS:
        value = getattr(c, name)
        if value is None and name in _OPTIONAL_POSITIVE_INTS:
            continue
        if not _is_int(value, 1):
            raise ConfigError(f"{name} must be an int >= 1 (below 2**63), got {value!r}")
    if not _is_int(c.seed, 0):
        raise ConfigError(f"seed must be an int in [0, 2**63), got {c.seed!r}")
    for name in _BOOLS:
        if not isinstance(getattr(c, name), bool):
            raise ConfigError(f"{name} must be a bool, got {getattr(c, name)!r}")
    for name in _NUMBERS:
        value = getattr(c, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{name} must be a number, got {value!r}")


def _check_logits_processors(c: EngineConfig) -> None:
    """``logits_processors`` as the qualified names the workers import
    (a class given as an object becomes its name), each imported here and
    checked to be a ``LogitsProcessor`` subclass, before any worker starts;
    refused with speculative decoding, as vLLM refuses them."""
    given = c.logits_processors
    if given is None:
        return
    if isinstance(given, (str, type)) or not isinstance(given, (list, tuple)):
        raise ConfigError(f"logits_processors must be a list of classes or qualified names, "
                          f"got {given!r}")
    from runner.sampling.logits_processor import (
        LogitsProcessorError,
        load_processor_class,
        qualified_name,
    )

    names = []
    try:
        for item in given:
            if isinstance(item, str):
                load_processor_class(item)
                names.append(item)
            else:
                names.append(qualified_name(item))
    except LogitsProcessorError as e:
        raise ConfigError(str(e)) from None
    if names and c.speculative_config is not None:
        raise ConfigError("custom logits processors are not supported with speculative "
                          "decoding (as in vLLM): give logits_processors or "
                          "speculative_config, not both")
    object.__setattr__(c, "logits_processors", names)


def _import_folders(names: list[str]) -> list[str]:
    """The folders this process imported the processors' modules from
    (``_check_logits_processors`` imported each), once each, in order."""
    from runner.sampling.logits_processor import import_folder

    folders = (import_folder(name) for name in names)
    return list(dict.fromkeys(f for f in folders if f is not None))


def _check_max_lora_rank(value: int) -> None:
    """One of vLLM's ranks (``MAX_LORA_RANKS``), as vLLM's LoRAConfig takes
    them: an adapter of a smaller rank is served, padded to it."""
    if value not in MAX_LORA_RANKS:
        raise ConfigError(f"max_lora_rank must be one of "
                          f"{', '.join(map(str, MAX_LORA_RANKS))}, got {value}")


def _check_max_model_len(value) -> None:
    """None (the model's positions), -1 ("auto", decided with the KV cache)
    or a length of at least a prompt token and an output token."""
    if value is None or _is_int(value, 2) or (type(value) is int and value == AUTO_MAX_MODEL_LEN):
        return
    raise ConfigError(f"max_model_len must be an int >= 2 (a prompt token and an output token) "
                      f"or -1 (auto: the longest the KV cache holds), got {value!r}")


def _check_choices(c: EngineConfig) -> None:
    """Each field whose metadata lists choices holds one of them (or None
    where None is the default)."""
    for f in fields(c):
        choices, value = f.metadata.get("choices"), getattr(c, f.name)
        if choices is None or value in choices or (value is None and f.default is None):
            continue
        raise ConfigError(f"{f.name} must be one of {choices}, got {value!r}")


def _check_vllm_options(c: EngineConfig) -> None:
    """vLLM's options for what tprun does not do take only the values that
    ask for what it does; ``load_format``'s "safetensors" and "gguf" become
    "auto" where they name what "auto" loads."""
    single_file = _names_a_file(c.model)
    if c.load_format in ("safetensors", "gguf"):
        if (c.load_format == "gguf") != single_file:
            raise ConfigError(f"load_format {c.load_format!r} does not match model {c.model!r}: "
                              "'gguf' is for a .gguf file, 'safetensors' for a model directory")
        object.__setattr__(c, "load_format", "auto")
    refused = {
        "tokenizer": (c.tokenizer is not None and not _same_path(c.tokenizer, c.model),
                      f"tprun reads the tokenizer from the model ({c.model!r}); a tokenizer of "
                      "its own is not supported"),
        "revision": (c.revision is not None,
                     "tprun loads local files and picks no revision: check that revision out "
                     "(huggingface-cli download ID --revision R --local-dir DIR) and give DIR "
                     "as the model"),
        "download_dir": (c.download_dir is not None,
                         "tprun downloads nothing: download the model (huggingface-cli download "
                         "ID --local-dir DIR) and give DIR as the model"),
        "quantization": (c.quantization is not None
                         and not (c.quantization == "gguf" and single_file),
                         "tprun has no quantized kernels; 'gguf' is taken only for a .gguf model, "
                         "whose weights are dequantized on load"),
        "kv_cache_dtype": (c.kv_cache_dtype not in ("auto", *KV_CACHE_DTYPE_NAMES),
                           "tprun keeps the KV cache in the model's dtype (dtype); only 'auto' "
                           "or that dtype's name (bfloat16, float16) is taken"),
    }
    for name, (bad, why) in refused.items():
        if bad:
            raise ConfigError(f"{name} {getattr(c, name)!r} is not supported: {why}")
    space = c.swap_space
    if isinstance(space, bool) or not isinstance(space, (int, float)) or not space >= 0:
        raise ConfigError(f"swap_space must be a number >= 0 (GiB), got {space!r}")
    check_structured_outputs_config(c.structured_outputs_config)


def _check_pooling(c: EngineConfig, pooler: PoolerSettings | None = None) -> None:
    """A pooling engine's options resolve (``EngineConfig.pooler``; or
    ``pooler``, the settings for the model) and ask for nothing a pooling
    model does not do: it samples nothing, so it takes no speculative
    decoding and no custom logits processors (vLLM refuses the latter with
    the same reason)."""
    if (pooler or c.pooler) is None:
        return
    if c.speculative is not None:
        raise ConfigError("speculative_config is for generation: a pooling model (runner "
                          "'pooling') samples nothing")
    if c.logits_processors:
        raise ConfigError("Pooling models do not support custom logits processors.")


def _check_reasoning_parser(name: str | None) -> None:
    if name is not None and name not in REASONING_PARSERS:
        raise ConfigError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                          f"got {name!r}")


def _check_generation_config(value: str) -> None:
    """vLLM's ``generation_config``: "auto", "vllm" or a folder that holds
    a generation_config.json."""
    if value in GENERATION_CONFIGS:
        return
    if not isinstance(value, str) or not os.path.isdir(value):
        raise ConfigError(f"generation_config must be 'auto', 'vllm' or a folder holding a "
                          f"generation_config.json, got {value!r} (not a folder)")
    if not os.path.isfile(os.path.join(value, "generation_config.json")):
        raise ConfigError(f"generation_config {value!r}: the folder holds no "
                          "generation_config.json")


def _same_path(a: str, b: str) -> bool:
    return a == b or os.path.realpath(a) == os.path.realpath(b)


def _names_a_file(model: str) -> bool:
    """Whether ``model`` names one file (a .gguf model), not a directory or 'tiny'."""
    from checkpoint.gguf_model import PACKAGE_PREFIX

    return model.startswith(PACKAGE_PREFIX) or os.path.isfile(model)


# vLLM's StructuredOutputsConfig keys, each with the values that ask for what
# tprun's grammars (llguidance's: vLLM's "guidance" backend) do.
_STRUCTURED_OUTPUTS_KEYS = {
    "backend": (("auto", "guidance"), "tprun's grammars are llguidance's (vLLM's 'guidance')"),
    "disable_fallback": ((True, False), "a bool"),
    "disable_any_whitespace": ((False,), "a server-wide default is not supported; a request "
                               "can set it in its structured_outputs"),
    "reasoning_parser": (("", *REASONING_PARSERS), "tprun's reasoning parsers"),
    "enable_in_reasoning": ((False,), "a grammar holds from the end of the reasoning on"),
}


def _json_object(value: dict | str, name: str) -> dict:
    """A dict option's value: the dict, or the JSON object a command line
    gave as text; ConfigError naming ``name`` for anything else."""
    try:
        return json_object(value, name)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_structured_outputs_config(value: dict | str | None) -> None:
    """vLLM's ``structured_outputs_config`` (a dict, or its JSON text from the
    command line): ConfigError unless every key holds a value that asks for
    what tprun does (``_STRUCTURED_OUTPUTS_KEYS``)."""
    if value is None:
        return
    value = _json_object(value, "structured_outputs_config")
    for key, got in value.items():
        if key not in _STRUCTURED_OUTPUTS_KEYS:
            raise ConfigError(f"structured_outputs_config: key {key!r} is not supported "
                              f"(supported: {sorted(_STRUCTURED_OUTPUTS_KEYS)})")
        allowed, why = _STRUCTURED_OUTPUTS_KEYS[key]
        if not any(got is v or (type(got) is type(v) and got == v) for v in allowed):
            raise ConfigError(f"structured_outputs_config: {key} {got!r} is not supported "
                              f"(taken: {', '.join(map(repr, allowed))}; {why})")


# vLLM's default n-gram sizes when neither bound is given.
DEFAULT_PROMPT_LOOKUP = 5
_SPEC_KEYS = {
    "ngram": {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
              "disable_by_batch_size"},
    "draft_model": {"method", "num_speculative_tokens", "model", "disable_by_batch_size"},
}


def parse_speculative_config(value: dict | str | None) -> SpeculativeConfig | None:
    """``speculative_config`` (a dict, or its JSON text from the command
    line) as a ``SpeculativeConfig``; ConfigError for anything else: an
    unknown method or key, ``num_speculative_tokens`` outside
    ``1 .. MAX_SPECULATIVE_TOKENS``, n-gram bounds below 1 or above that
    limit or ``prompt_lookup_min > prompt_lookup_max``, a draft model that
    does not exist. As vLLM: one missing n-gram bound takes the other's
    value, both missing take ``DEFAULT_PROMPT_LOOKUP``. A draft model's
    own rules (vocabulary, heads) are ``EngineConfig.check_draft_model``'s."""
    if value is None:
        return None
    value = _json_object(value, "speculative_config")
    value = _with_method(value)
    method = value.get("method")
    if method not in SPECULATIVE_METHODS:
        raise ConfigError(f"speculative_config method must be one of {SPECULATIVE_METHODS}, "
                          f"got {method!r}")
    unknown = sorted(set(value) - _SPEC_KEYS[method])
    if unknown:
        raise ConfigError(f"speculative_config: unknown key(s) {unknown} for method {method!r} "
                          f"(allowed: {sorted(_SPEC_KEYS[method])})")
    k = _spec_int(value, "num_speculative_tokens", None)
    limit = value.get("disable_by_batch_size")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or limit < 1):
        raise ConfigError(f"speculative_config: disable_by_batch_size must be an int >= 1, "
                          f"got {limit!r}")
    if method == "ngram":
        given = {name: _spec_int(value, name, None)  # each checked under its own name
                 for name in ("prompt_lookup_min", "prompt_lookup_max")
                 if value.get(name) is not None}
        lo = given.get("prompt_lookup_min", given.get("prompt_lookup_max", DEFAULT_PROMPT_LOOKUP))
        hi = given.get("prompt_lookup_max", given.get("prompt_lookup_min", DEFAULT_PROMPT_LOOKUP))
        if lo > hi:
            raise ConfigError(f"speculative_config: prompt_lookup_min {lo} > "
                              f"prompt_lookup_max {hi}")
        return SpeculativeConfig(method=method, num_speculative_tokens=k,
                                 prompt_lookup_max=hi, prompt_lookup_min=lo,
                                 disable_by_batch_size=limit)
    model = value.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError("speculative_config: method 'draft_model' needs a 'model' "
                          "('tiny', a model directory or a .gguf file)")
    if not model_exists(model):
        raise ConfigError(f"speculative_config: draft model {model!r} does not exist")
    return SpeculativeConfig(method=method, num_speculative_tokens=k, model=model,
                             disable_by_batch_size=limit)


def _with_method(value: dict) -> dict:
    """As vLLM infers it when "method" is left out: "ngram" where the model
    is "ngram" or "[ngram]" (a name, not a model), "draft_model" for any
    other model."""
    if "method" in value or value.get("model") is None:
        return value
    if value["model"] in ("ngram", "[ngram]"):
        return {**{k: v for k, v in value.items() if k != "model"}, "method": "ngram"}
    return {**value, "method": "draft_model"}


def _spec_int(value: dict, name: str, default: int | None) -> int:
    """``value[name]``, an int in ``1 .. MAX_SPECULATIVE_TOKENS``."""
    got = value.get(name, default)
    if got is None:
        raise ConfigError(f"speculative_config needs {name}")
    if not isinstance(got, int) or isinstance(got, bool) or not 1 <= got <= (
            MAX_SPECULATIVE_TOKENS):
        raise ConfigError(f"speculative_config: {name} must be an int in "
                          f"1..{MAX_SPECULATIVE_TOKENS}, got {got!r}")
    return got


def model_exists(model: str) -> bool:
    """Whether ``model`` names a model: 'tiny', a path that exists, or a
    pkg:PACKAGE/FILE that does."""
    from checkpoint.gguf_model import PACKAGE_PREFIX, package_file

    if model == "tiny":
        return True

    if model.startswith(PACKAGE_PREFIX):
        try:
            return os.path.isfile(package_file(model))
        except (ValueError, OSError):
            return False
    return os.path.exists(model)
