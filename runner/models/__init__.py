"""Building a Llama-family CausalLM from a checkpoint directory or a bare config."""

from __future__ import annotations

import torch

from runner.attention.selector import get_attention_backend
from runner.distributed import TensorParallelGroup
from runner.loader import fill_random_weights, load_weights
from runner.model_config import ModelConfig
from runner.models.causal_lm import CausalLM

__all__ = ["CausalLM", "build_model", "build_model_from_config"]

INIT_MODES = ("empty", "random")


def build_model_from_config(config: ModelConfig, dtype: torch.dtype, device: torch.device,
                            tp: TensorParallelGroup, attention_backend: str | None = None,
                            init: str = "random", seed: int = 0) -> CausalLM:
    """This rank's shard of the model, allocated directly on ``device``.

    init="random": weights from ``fill_random_weights`` (for benchmarks);
    init="empty": uninitialized, for a loader to fill.
    """
    if init not in INIT_MODES:
        raise ValueError(f"init must be one of {INIT_MODES}, got {init!r}")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported model dtype {dtype}")
    device = torch.device(device)
    backend = get_attention_backend(attention_backend, device)
    with torch.device(device):
        model = CausalLM(config, tp, backend, dtype)
    if init == "random":
        fill_random_weights(model, seed)
    return model.eval()


def build_model(model_dir: str, dtype: torch.dtype, device: torch.device,
                tp: TensorParallelGroup, attention_backend: str | None = None) -> CausalLM:
    """Read ``model_dir``'s config and this rank's slices of its safetensors weights."""
    config = ModelConfig.from_dir(model_dir)
    model = build_model_from_config(config, dtype, device, tp, attention_backend, init="empty")
    load_weights(model, model_dir)
    return model
