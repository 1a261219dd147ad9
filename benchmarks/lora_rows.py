"""bench_decode's LoRA rows (``--max-loras N --max-lora-rank R``): random
adapters in every slot, each request running one of them.

Every adapter targets all seven projections of every layer at rank R, with
random factors (A scaled by 1 / sqrt(in_features), B small, so the tokens
stay those of a model, not noise), written in PEFT's format and loaded
through the runner's own path (``LoRAAdapters.load``: this rank's shard).
Request i runs adapter slot i % N (``DecodeDriver``), so a batch of at
least N rows uses every adapter.

The floor of a LoRA step adds the factor bytes it must read: each adapter
that the batch uses, once, at its rank, this rank's shard (A and B of every
projection; the zero rows a slot pads to R and the zero blocks of the fused
projections' B are not counted).
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from ipc.lora_adapter import (
    ATTENTION_TARGETS,
    CONFIG_FILE,
    TARGET_MODULES,
    WEIGHTS_FILE,
    module_shape,
)
from ipc.model_config import ModelConfig


def write_random_adapter(path: str, model: ModelConfig, rank: int, seed: int) -> str:
    """A random adapter of every target module at ``rank``, in PEFT's files
    under ``path`` (bf16 factors, scale 1); returns ``path``."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(model.num_hidden_layers):
        for module in TARGET_MODULES:
            block = "self_attn" if module in ATTENTION_TARGETS else "mlp"
            fan_in, fan_out = module_shape(model, module)
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            a = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            b = torch.randn(fan_out, rank, generator=gen) * 0.01
            tensors[f"{prefix}.lora_A.weight"] = a.to(torch.bfloat16)
            tensors[f"{prefix}.lora_B.weight"] = b.to(torch.bfloat16)
    os.makedirs(path, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "bias": "none",
              "target_modules": list(TARGET_MODULES), "task_type": "CAUSAL_LM"}
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(config, f)
    save_file(tensors, os.path.join(path, WEIGHTS_FILE))
    return path


def load_random_adapters(runner, rank: int, root: str) -> None:
    """Every adapter slot of ``runner`` (built with LoRA) <- its own random
    adapter of ``rank`` (seed: the slot)."""
    for slot in range(runner.lora.config.max_loras):
        path = write_random_adapter(os.path.join(root, f"adapter{slot}"),
                                    runner.config.model_config, rank, seed=slot)
        runner.lora.load(slot, path)


def step_adapter_bytes(lora, batch: int) -> int:
    """Factor bytes a step of ``batch`` requests reads (module docstring):
    min(batch, slots) adapters, each at the stacks' rank, this rank's shard."""
    per_adapter = 0
    for stacks in lora.layers:
        for _, stack in stacks.values():
            a_rows = stack.parts * stack.rank  # one slot's rows of A
            per_adapter += (a_rows * stack.a.shape[1] + stack.b.shape[0] * stack.rank) * \
                stack.a.element_size()
    return min(batch, lora.config.max_loras) * per_adapter
