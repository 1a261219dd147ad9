"""The engine's configuration: vLLM's names, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

_DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class EngineConfig:
    """What ``LLM(...)`` and the CLI accept.

    ``device="auto"`` picks CUDA when available. ``max_model_len=None``
    takes the model's ``max_position_embeddings``. ``executor`` is "mp"
    (worker daemons) or "uni" (in process, TP=1 only); None picks "uni" at
    TP=1 and "mp" above, or "mp" when ``attach_workers_dir`` is set: then the
    executor binds its endpoints in that private directory and waits for
    workers started elsewhere (e.g. by torchrun) instead of spawning them.

    ``async_scheduling`` (vLLM's name): schedule and send step N+1 before
    step N's output arrives (at most two steps in flight); outputs are the
    same either way. ``enable_prefix_caching``: reuse KV blocks of equal
    prompt prefixes. ``disable_log_stats``: no periodic stats line (the
    serving loop logs one every ``log_stats_interval_s`` seconds otherwise).
    """

    model: str = "tiny"
    tensor_parallel_size: int = 1
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    num_gpu_blocks_override: int | None = None
    enforce_eager: bool = False
    # NCCL for every all-reduce instead of the one-shot kernel over peer memory.
    disable_custom_all_reduce: bool = False
    seed: int = 0
    attention_backend: str | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int = 1 << 30
    load_format: str = "auto"
    step_timeout_s: float = 300.0
    executor: str | None = None
    attach_workers_dir: str | None = None
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    async_scheduling: bool = True
    enable_prefix_caching: bool = True
    disable_log_stats: bool = True
    log_stats_interval_s: float = 10.0

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.device not in _DEVICES:
            raise ValueError(f"device must be one of {_DEVICES}, got {self.device!r}")
        if self.executor not in (None, "mp", "uni"):
            raise ValueError(f"executor must be 'mp' or 'uni', got {self.executor!r}")
        if self.executor == "uni" and self.attach_workers_dir is not None:
            raise ValueError("attach_workers_dir needs executor 'mp'")
        if self.executor == "uni" and self.tensor_parallel_size != 1:
            raise ValueError("executor 'uni' runs TP=1 only")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError("num_gpu_blocks_override must be >= 1")
        for name in ("async_scheduling", "enable_prefix_caching", "disable_log_stats"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not self.log_stats_interval_s > 0:
            raise ValueError(
                f"log_stats_interval_s must be > 0, got {self.log_stats_interval_s}"
            )

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
