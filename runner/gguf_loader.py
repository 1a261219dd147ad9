"""Loading a GGUF file's tensors into a model's tensor-parallel shards.

Each checkpoint name the model asks for (Hugging Face naming, from
``model.weight_slices()``) maps to one llama.cpp tensor (``blk.N.attn_q``
...; ``ipc.gguf_tensors.hf_name``). A rank dequantizes only the rows it keeps when it splits a weight by
rows (quantization blocks run along a row), the whole tensor otherwise, to
float32 with ``gguf.quants.dequantize``, then casts to the model's dtype.

llama.cpp stores the rows of each q and k head permuted for its rotary
layout (pairs (x_i, x_{i + d/2}) made adjacent); ``unpermute_rows`` puts
them back. Slices of q and k are whole heads, so this works per shard.
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.gguf_tensors import hf_name
from runner.layers import WeightSlice


def unpermute_rows(rows: np.ndarray, head_dim: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order on whole heads: within each head, stored
    row 2i + j holds the original row j * head_dim / 2 + i."""
    heads = rows.shape[0] // head_dim
    rest = rows.shape[1:]
    split = rows.reshape(heads, head_dim // 2, 2, *rest)
    return split.swapaxes(1, 2).reshape(rows.shape)


def load_gguf_weights(model: torch.nn.Module, path: str) -> None:
    """Fill every parameter named by ``model.weight_slices()`` from the GGUF file.

    Raises ValueError if a tensor is missing, of an unsupported type, or of a
    shape that does not fit the model. Tensors the model does not use are
    skipped.
    """
    import gguf

    plan: dict[str, WeightSlice] = model.weight_slices()
    head_dim = model.config.head_dim
    loaded: set[str] = set()
    for tensor in gguf.GGUFReader(path).tensors:
        name = hf_name(tensor.name)
        if name not in plan:
            continue
        permuted = ".q_proj." in name or ".k_proj." in name
        _copy_slice(tensor, plan[name], name, head_dim if permuted else None)
        loaded.add(name)
    missing = sorted(set(plan) - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ValueError(f"GGUF file {path!r} lacks {len(missing)} tensors: {shown}")


def _copy_slice(tensor, where: WeightSlice, name: str, head_dim: int | None) -> None:
    """Dequantize ``where``'s part of one GGUF tensor and copy it into the parameter."""
    import gguf

    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest dim first
    if shape != where.source_shape():
        raise ValueError(f"GGUF tensor {tensor.name!r} ({name}) has shape {shape}; the model "
                         f"config implies {where.source_shape()}")
    rows = slice(where.src_start, where.src_start + where.length)
    raw = tensor.data
    if where.dim == 0 and len(shape) > 1:
        raw = raw[rows]  # whole quantization blocks: each row is its own run of blocks
    try:
        values = gguf.quants.dequantize(raw, tensor.tensor_type)
    except NotImplementedError as e:
        raise ValueError(f"GGUF tensor {tensor.name!r} has unsupported type "
                         f"{tensor.tensor_type.name}") from e
    values = np.asarray(values, dtype=np.float32).reshape(
        (where.length, *shape[1:]) if where.dim == 0 and len(shape) > 1 else shape)
    if len(shape) == 1 or where.dim != 0:
        index = [slice(None)] * len(shape)
        index[where.dim] = rows
        values = values[tuple(index)]
    if head_dim is not None:
        values = unpermute_rows(values, head_dim)
    values = np.ascontiguousarray(values)
    if not values.flags.writeable:  # float32 tensors come straight from the file's map
        values = values.copy()
    where.destination().copy_(torch.from_numpy(values))
