"""The paged KV cache: its dtype, its size per block, its allocation."""

from __future__ import annotations

import math

import torch

from runner.config import RunnerConfig
from runner.model_config import ModelConfig

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(config: RunnerConfig) -> torch.dtype:
    """``auto`` follows the checkpoint's config.json (float32 if it says nothing)."""
    if config.dtype != "auto":
        return _DTYPES[config.dtype]
    model_dtype = ModelConfig.from_dir(config.model).dtype
    if isinstance(model_dtype, torch.dtype):
        return model_dtype
    return _DTYPES.get(str(model_dtype), torch.float32)


def kv_cache_bytes_per_block(model, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers on this rank."""
    shape = model.kv_cache_shape(1, block_size)
    per_layer = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return per_layer * model.config.num_hidden_layers


def allocate_kv_caches(
    model, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """One tensor per layer, shape ``model.kv_cache_shape(num_blocks, block_size)``.

    Unwritten entries are never read: attention reads only positions below
    each request's seq_len, all of which were written first.
    """
    shape = model.kv_cache_shape(num_blocks, block_size)
    return [
        torch.empty(shape, dtype=dtype, device=device)
        for _ in range(model.config.num_hidden_layers)
    ]
