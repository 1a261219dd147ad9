"""The files a model directory's weights are read from.

``checkpoint_files`` is the one rule of which safetensors files hold a
model's weights: the runner's loader (runner/loader.py) reads them, and the
engine checks them first (``check_weight_files``), before any worker starts,
so a directory without weights, with a file cut short, or whose config.json
disagrees with its tensors' shapes, is one clear error instead of a
traceback from every rank. It lives here because both sides use
it and the runner imports no package but ipc. A directory with ``GGUF_FILE``
holds its weights in that file (read whole when it was converted); its
tensor table is checked against config.json the same way.
"""

from __future__ import annotations

import glob
import json
import os
from typing import NamedTuple

from ipc.config import GGUF_FILE
from ipc.gguf_tensors import hf_name, tensor_shapes
from ipc.model_config import ModelConfig
from ipc.weight_shapes import TensorShape, checkpoint_shapes

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def checkpoint_files(model_dir: str) -> list[str]:
    """The safetensors files of ``model_dir``, in a fixed order: those its
    index names, else ``model.safetensors``, else every ``*.safetensors``.
    ValueError when there is none, or the index cannot be read."""
    index = os.path.join(model_dir, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"cannot read {index}: no weight_map of tensor names to files "
                             f"({type(e).__name__}: {e})") from None
        return [os.path.join(model_dir, name) for name in names]
    single = os.path.join(model_dir, SINGLE_FILE)
    if os.path.isfile(single):
        return [single]
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise ValueError(f"no safetensors checkpoint in {model_dir!r} (model.safetensors, "
                         f"{INDEX_FILE} or *.safetensors)")
    return files


def check_weight_files(model_dir: str, config: ModelConfig, classify: bool = False) -> None:
    """The weights of ``model_dir`` load into the model ``config`` describes
    (a classifier's with ``classify``: ``checkpoint_shapes``):
    every file ``checkpoint_files`` names exists and is a whole safetensors
    file (its header reads, and the file holds every byte the header lists),
    and together they hold every tensor the model reads in the shape
    config.json implies (``checkpoint_shapes``). A directory with
    ``GGUF_FILE`` gets the same check of tensors against that file's tensor
    table. ValueError naming the file (a tensor, its shape and the expected
    one) otherwise. Reads the headers only, never tensor data."""
    gguf_path = os.path.join(model_dir, GGUF_FILE)
    if os.path.exists(gguf_path):
        found = _gguf_tensors(os.path.realpath(gguf_path))
    else:
        found = _safetensors_tensors(model_dir)
    _check_tensors(found, checkpoint_shapes(config, classify), os.path.join(model_dir, "config.json"),
                   model_dir)


class _Found(NamedTuple):
    """A tensor as a weight file's header lists it."""

    shape: tuple[int, ...]
    path: str
    stored_name: str  # its name in the file (a GGUF file's llama.cpp name)


def _safetensors_tensors(model_dir: str) -> dict[str, _Found]:
    """Every tensor of the checkpoint's files by name, headers read only;
    ValueError naming a file that is missing or does not read whole."""
    from safetensors import safe_open

    found: dict[str, _Found] = {}
    for path in checkpoint_files(model_dir):
        if not os.path.isfile(path):
            raise ValueError(f"{path} is missing ({INDEX_FILE} names it)")
        try:
            with safe_open(path, framework="numpy") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    found[name] = _Found(tuple(f.get_slice(name).get_shape()), path, name)
        except Exception as e:  # noqa: BLE001 (safetensors raises its own error type)
            raise ValueError(f"{path} is not a readable safetensors file: {e}") from None
    return found


def _gguf_tensors(path: str) -> dict[str, _Found]:
    """The GGUF file's tensors by their checkpoint names (those the model
    reads; llama.cpp's others are left out)."""
    found: dict[str, _Found] = {}
    for stored, shape in tensor_shapes(path).items():
        name = hf_name(stored)
        if name is not None:
            found[name] = _Found(shape, path, stored)
    return found


def _check_tensors(found: dict[str, _Found], expected: dict[str, TensorShape],
                   config_path: str, model_dir: str) -> None:
    """ValueError for the first tensor whose shape differs from the expected
    one (naming its file, both shapes and the config fields behind the
    expected one), else for the tensors no file holds."""
    wrong = [name for name, shape in expected.items()
             if name in found and found[name].shape != shape.shape]
    if wrong:
        name = wrong[0]
        tensor, shape = found[name], expected[name]
        stored = name if tensor.stored_name == name else f"{tensor.stored_name} ({name})"
        more = f"; {len(wrong)} tensors differ" if len(wrong) > 1 else ""
        raise ValueError(f"{tensor.path}: tensor {stored} has shape {list(tensor.shape)}, "
                         f"but {config_path} implies {shape.describe()}{more}")
    missing = [name for name in expected if name not in found]
    if missing:
        shown = ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
        files = sorted({tensor.path for tensor in found.values()}) or [model_dir]
        verb = "lacks" if len(files) == 1 else "lack"
        raise ValueError(f"{', '.join(files)} {verb} {len(missing)} tensors that {config_path} "
                         f"implies: {shown}")
