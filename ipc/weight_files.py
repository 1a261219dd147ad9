"""The files a model directory's weights are read from.

``checkpoint_files`` is the one rule of which safetensors files hold a
model's weights: the runner's loader (runner/loader.py) reads them, and the
engine checks them first (``check_weight_files``), before any worker starts,
so a directory without weights, or with a file cut short, is one clear error
instead of a traceback from every rank. It lives here because both sides use
it and the runner imports no package but ipc. A directory with ``GGUF_FILE``
holds its weights in that file (read whole when it was converted).
"""

from __future__ import annotations

import glob
import json
import os

from ipc.config import GGUF_FILE

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


def check_weight_files(model_dir: str) -> None:
    """Every file ``checkpoint_files`` names exists and is a whole
    safetensors file (its header reads, and the file holds every byte the
    header lists): ValueError naming the file otherwise. Reads the headers
    only."""
    from safetensors import safe_open

    if os.path.exists(os.path.join(model_dir, GGUF_FILE)):
        return
    for path in checkpoint_files(model_dir):
        if not os.path.isfile(path):
            raise ValueError(f"{path} is missing ({INDEX_FILE} names it)")
        try:
            with safe_open(path, framework="numpy"):
                pass
        except Exception as e:  # noqa: BLE001 (safetensors raises its own error type)
            raise ValueError(f"{path} is not a readable safetensors file: {e}") from None
