"""The sampling defaults a model's creator recommends, from its generation_config.json.

vLLM reads them by default (``--generation-config auto``; a folder given
there instead holds the file to read) and uses them where a request leaves
a field unset: ``temperature``, ``top_p``,
``top_k``, ``min_p`` and ``repetition_penalty`` as they are, and
``max_new_tokens`` as a cap on ``max_tokens``. ``sampling_defaults`` gives
those fields by ``SamplingParams``' names; a file without them (or no
file, as a GGUF model has) gives none. Other keys (``do_sample``, the
token ids, beam settings) are not sampling defaults and are left out, as
vLLM leaves them. A folder given for the file also brings its
``eos_token_id`` (``eos_token_ids``): vLLM stops at those too. The
model's own file's ``eos_token_id`` is in its description
(``checkpoint.description``) and ends outputs under every value, "vllm"
included: vLLM reads the model's file for its special tokens whichever
sampling defaults it takes.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _read(folder: str) -> tuple[str, dict]:
    """The folder's generation_config.json's path and contents ({} where
    there is none); ``ValueError`` naming it where it is not JSON."""
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        return path, {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from None
    return path, config if isinstance(config, dict) else {}


def eos_token_ids(folder: str) -> tuple[int, ...]:
    """The folder's ``eos_token_id`` (one id or a list) as a tuple;
    ``ValueError`` naming the file for one that is not a non-negative int."""
    path, config = _read(folder)
    given = config.get("eos_token_id")
    ids = [] if given is None else [given] if not isinstance(given, list) else given
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ValueError(f"{path}: eos_token_id must be an id or a list of ids, got {given!r}")
    return tuple(dict.fromkeys(ids))


def sampling_defaults(folder: str) -> dict[str, Any]:
    """``{field: value}`` of the recommended sampling in the folder's
    generation_config.json (``max_tokens`` from ``max_new_tokens``);
    ``ValueError`` naming the file for a value that is not a number of the
    field's kind."""
    path, config = _read(folder)
    out = {}
    for key in (*_SAMPLING_KEYS, "max_new_tokens"):
        value = config.get(key)
        if value is None:
            continue
        integral = key in ("top_k", "max_new_tokens")
        if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"{path}: {key} must be {'an int' if integral else 'a number'}, "
                             f"got {value!r}")
        out["max_tokens" if key == "max_new_tokens" else key] = value
    return out
