"""Loading safetensors checkpoints into a model's tensor-parallel shards.

Each rank reads only its slices (``safe_open(...).get_slice``), casts them to
the model's dtype and copies them into place. Works for a single
``model.safetensors`` and for sharded checkpoints with
``model.safetensors.index.json``; bf16, fp16 and fp32 tensors. A directory
with a ``model.gguf`` (checkpoint/gguf_model.py writes one for a GGUF file) is
read by runner/gguf_loader.py instead.
"""

from __future__ import annotations

import os
import zlib

import torch
from safetensors import safe_open

from ipc.config import GGUF_FILE
from ipc.weight_files import checkpoint_files
from runner.gguf_loader import load_gguf_weights
from runner.layers import WeightSlice

# Checkpoint tensors that carry nothing the model needs.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_weights(model: torch.nn.Module, model_dir: str) -> None:
    """Fill every parameter named by ``model.weight_slices()`` from ``model_dir``.

    Raises ValueError if a tensor is missing or its shape does not fit the
    model. Tensors the model does not use are skipped.
    """
    gguf_path = os.path.join(model_dir, GGUF_FILE)
    if os.path.exists(gguf_path):
        load_gguf_weights(model, gguf_path)
        return
    plan: dict[str, WeightSlice] = model.weight_slices()
    loaded: set[str] = set()
    for path in checkpoint_files(model_dir):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name in plan:
                    _copy_slice(f.get_slice(name), plan[name], name)
                    loaded.add(name)
    missing = sorted(set(plan) - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ValueError(f"checkpoint in {model_dir!r} lacks {len(missing)} tensors: {shown}")


def _copy_slice(source, where: WeightSlice, name: str) -> None:
    """Read ``where``'s rows of one checkpoint tensor and copy them into the parameter."""
    shape = tuple(source.get_shape())
    if shape != where.source_shape():
        raise ValueError(
            f"checkpoint tensor {name!r} has shape {shape}; the model config implies "
            f"{where.source_shape()}"
        )
    index = [slice(None)] * len(shape)
    index[where.dim] = slice(where.src_start, where.src_start + where.length)
    where.destination().copy_(source[tuple(index)])


def fill_random_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights for benchmarks, generated on the parameters' device.

    Each checkpoint tensor is drawn whole from a generator seeded by its name,
    then sliced like a loaded one, so every tensor-parallel size gives shards
    of the same model. Matrices are N(0, 1 / fan_in), so activations keep unit
    scale; embedding rows N(0, 1); norm weights 1; biases 0. Padding rows of
    the vocabulary stay zero.
    """
    for name, where in model.weight_slices().items():
        shape = where.source_shape()
        dest = where.destination()
        if name.endswith("bias"):
            dest.zero_()
        elif len(shape) == 1:
            dest.fill_(1.0)
        else:
            generator = torch.Generator(device=dest.device)
            generator.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            full = torch.randn(shape, generator=generator, device=dest.device, dtype=dest.dtype)
            std = 1.0 if "embed_tokens" in name else shape[1] ** -0.5
            index = [slice(None)] * len(shape)
            index[where.dim] = slice(where.src_start, where.src_start + where.length)
            dest.copy_(full[tuple(index)] * std)
