"""A model directory's ``ModelConfig`` (``ipc.model_config``), read once.

``describe(model_dir)`` reads config.json (transformers 4 or 5 layout; a
multimodal wrapper's ``text_config``) and generation_config.json. The
rules of the result (architectures, dtypes, shapes) are ``ModelConfig``'s;
this file only translates Hugging Face's spelling, with Hugging Face's
defaults for what a config leaves out. ``eos_token_ids`` is the union, in
order of first appearance, of ``eos_token_id`` in both files (each may be
an int or a list). Every problem is a ``ValueError`` naming the file.
"""

from __future__ import annotations

import json
import os
from typing import Any

import msgspec

from ipc.model_config import DTYPE_ALIASES, Llama3RopeScaling, ModelConfig


def describe(model_dir: str) -> ModelConfig:
    """The description of the HF model directory ``model_dir``."""
    _check_exists(model_dir)
    path = os.path.join(model_dir, "config.json")
    config = _load(path, required=True)
    generation = _load(os.path.join(model_dir, "generation_config.json"), required=False)
    try:
        return from_hf_dict(config, generation)
    except (KeyError, TypeError, ValueError, msgspec.ValidationError) as e:
        detail = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise ValueError(f"{path}: {detail}") from e


def from_hf_dict(hf: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    """Build from the parsed contents of a config.json (and generation_config.json)."""
    hf = {**(hf.get("text_config") or {}), **hf}
    archs = hf.get("architectures") or []
    arch = archs[0] if archs else f"<none, model_type={hf.get('model_type')!r}>"
    _check_activation(hf)
    heads = hf["num_attention_heads"]
    theta, scaling = _rope(hf)
    bias = bool(hf.get("attention_bias", False))
    bos = hf.get("bos_token_id")
    if bos is None:
        bos = (generation or {}).get("bos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=_positive_int_or_none(hf.get("max_position_embeddings")),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=bias or arch == "Qwen2ForCausalLM",
        o_bias=bias and arch != "Qwen2ForCausalLM",
        qk_norm=arch == "Qwen3ForCausalLM",
        dtype=_dtype(hf),
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=_eos_ids(hf.get("eos_token_id"), (generation or {}).get("eos_token_id")),
        labels=_labels(hf),
        problem_type=_optional_text(hf, "problem_type"),
        sentence_transformers_activation=_sentence_transformers_activation(hf),
        **_sliding(hf, arch),
    )


def _labels(hf: dict[str, Any]) -> tuple[str, ...]:
    """A classifier's label names by index: ``id2label``'s (keys are the
    indices, as text in JSON), transformers' default ``LABEL_<i>`` where it
    names none; ``num_labels`` of them where config.json gives it, else as
    many as ``id2label`` holds, else Hugging Face's default of 2."""
    names = {int(k): str(v) for k, v in (hf.get("id2label") or {}).items()}
    count = hf.get("num_labels")
    if not isinstance(count, int) or isinstance(count, bool):
        count = len(names) or 2
    if count < 1:
        raise ValueError(f"num_labels must be >= 1, got {count}")
    return tuple(names.get(i, f"LABEL_{i}") for i in range(count))


def _sentence_transformers_activation(hf: dict[str, Any]) -> str | None:
    """The activation a sentence-transformers cross-encoder names for its
    logits: ``sentence_transformers.activation_fn`` where that key is there
    (sentence-transformers 4 and later write it), else the older
    ``sbert_ce_default_activation_function``."""
    settings = hf.get("sentence_transformers")
    if isinstance(settings, dict) and "activation_fn" in settings:
        return _optional_text(settings, "activation_fn", "sentence_transformers.")
    return _optional_text(hf, "sbert_ce_default_activation_function")


def _optional_text(fields: dict[str, Any], key: str, prefix: str = "") -> str | None:
    value = fields.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{prefix}{key} must be a string, got {value!r}")
    return value


def _load(path: str, required: bool) -> dict[str, Any]:
    if not os.path.isfile(path):
        if required:
            raise ValueError(f"missing {path}: not a Hugging Face model directory")
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from e


def looks_like_hub_id(model: str) -> bool:
    """'org/name' that is not a path on this machine."""
    parts = model.split("/")
    return (len(parts) == 2 and all(parts) and not model.startswith((".", "~"))
            and not os.path.exists(model))


def _check_exists(model_dir: str) -> None:
    """A clear word for a path that is not there, with a hint for hub ids."""
    if os.path.exists(model_dir):
        return
    hint = ""
    if looks_like_hub_id(model_dir):
        hint = (f"; {model_dir!r} looks like a Hugging Face hub id, and tprun reads local "
                f"files only: download it first (huggingface-cli download {model_dir} "
                f"--local-dir DIR) and pass --model DIR")
    raise ValueError(f"model {model_dir!r} is not a local directory{hint}")


def _positive_int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _check_activation(hf: dict) -> None:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' is implemented")
    if hf.get("mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported")


def _rope(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
    """(theta, scaling) from ``rope_parameters`` (transformers 5) or the older keys."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = hf.get("rope_scaling") or {}
    for key, value in legacy.items():
        params.setdefault(key, value)
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise ValueError(f"unsupported rope type {kind!r}; supported: 'default', 'llama3'")
    scaling = Llama3RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )
    return theta, scaling


def _dtype(hf: dict) -> str:
    name = str(hf.get("dtype") or hf.get("torch_dtype") or "float32").removeprefix("torch.")
    return DTYPE_ALIASES.get(name, name)


def _eos_ids(*sources: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for source in sources:
        values = [] if source is None else [source] if isinstance(source, int) else source
        ids += [int(t) for t in values if int(t) not in ids]
    return tuple(ids)


def _sliding(hf: dict, arch: str) -> dict:
    """``sliding_window`` and ``sliding_layers`` as transformers reads them:
    ``layer_types`` when the config lists them; else Qwen2/3 slide from layer
    ``max_window_layers`` on (only with ``use_sliding_window``), Mistral on
    every layer, Llama never."""
    window = hf.get("sliding_window")
    qwen = arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
    if not window or arch.startswith("Llama") or (qwen and not hf.get("use_sliding_window")):
        return {"sliding_window": None, "sliding_layers": ()}
    num_layers = hf["num_hidden_layers"]
    if hf.get("layer_types"):
        layers = [i for i, kind in enumerate(hf["layer_types"]) if kind == "sliding_attention"]
    elif qwen:
        layers = list(range(hf.get("max_window_layers", 28), num_layers))
    else:
        layers = list(range(num_layers))
    if not layers:
        return {"sliding_window": None, "sliding_layers": ()}
    return {"sliding_window": int(window), "sliding_layers": tuple(layers)}
