"""Building a Llama-family CausalLM from its ``ModelConfig`` (the engine's
description of the checkpoint; nothing here reads a config file)."""

from __future__ import annotations

import torch

from ipc.model_config import ModelConfig
from runner.attention.selector import get_attention_backend
from runner.distributed import TensorParallelGroup
from runner.loader import fill_random_weights, load_weights
from runner.models.causal_lm import CausalLM

__all__ = ["CausalLM", "build_model", "build_model_from_config"]

INIT_MODES = ("empty", "random")


def build_model_from_config(config: ModelConfig, dtype: torch.dtype, device: torch.device,
                            tp: TensorParallelGroup, attention_backend: str | None = None,
                            init: str = "random", seed: int = 0,
                            max_positions: int | None = None,
                            fold_norms: bool = True, classify: bool = False) -> CausalLM:
    """This rank's shard of the model, allocated directly on ``device``.

    init="random": weights from ``fill_random_weights`` (for benchmarks),
    the norms folded (``CausalLM.fold_norm_weights``); init="empty":
    uninitialized, for a loader to fill (then fold). ``max_positions``
    bounds the rotary tables (default: the model's positions).
    ``fold_norms`` False keeps every norm's weight in its norm (LoRA
    serving: an adapter's A reads the normed input as the checkpoint's
    projections do, so the norms are never carried by the matmuls).
    ``classify``: a score head instead of the LM head (``CausalLM``).
    """
    if init not in INIT_MODES:
        raise ValueError(f"init must be one of {INIT_MODES}, got {init!r}")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported model dtype {dtype}")
    device = torch.device(device)
    backend = get_attention_backend(attention_backend, device)
    with torch.device(device):
        model = CausalLM(config, tp, backend, dtype, max_positions, classify)
    if init == "random":
        fill_random_weights(model, seed)
        if fold_norms:
            model.fold_norm_weights()
    return model.eval()


def build_model(config: ModelConfig, model_dir: str, dtype: torch.dtype, device: torch.device,
                tp: TensorParallelGroup, attention_backend: str | None = None,
                max_positions: int | None = None, fold_norms: bool = True,
                classify: bool = False) -> CausalLM:
    """The model ``config`` describes, with this rank's slices of ``model_dir``'s
    weights (``fold_norms`` and ``classify`` as ``build_model_from_config``
    takes them)."""
    model = build_model_from_config(config, dtype, device, tp, attention_backend, init="empty",
                                    max_positions=max_positions, classify=classify)
    load_weights(model, model_dir)
    if fold_norms:
        model.fold_norm_weights()
    return model
