"""The runner's configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

_DTYPES = ("auto", "float32", "float16", "bfloat16")
_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class RunnerConfig:
    """Everything a worker needs to build its runner.

    ``max_num_seqs`` is the number of request slots (rows of every persistent
    tensor); ``max_num_batched_tokens`` sizes the per-step input buffers;
    ``max_model_len`` sizes ``all_token_ids`` and the block tables.
    ``kv_cache_memory_bytes`` bounds the KV cache on CPU;
    ``gpu_memory_utilization`` is the share of the GPU the worker may use.
    ``load_format="dummy"`` fills random weights instead of reading the
    checkpoint (only config.json is needed): for benchmarks of real shapes.
    """

    model: str
    device: str = "cpu"
    dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    seed: int = 0
    enforce_eager: bool = False
    disable_custom_all_reduce: bool = False
    attention_backend: str | None = None
    kv_cache_memory_bytes: int = 1 << 30
    gpu_memory_utilization: float = 0.9
    load_format: str = "auto"

    def __post_init__(self) -> None:
        if self.device not in _DEVICES:
            raise ValueError(f"device must be one of {_DEVICES}, got {self.device!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {self.load_format!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )

    @property
    def max_num_blocks_per_req(self) -> int:
        return -(-self.max_model_len // self.block_size)
