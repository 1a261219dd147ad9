"""What the engine needs to know of a model, read from its HF directory.

``eos_token_ids`` is the union, in order of first appearance, of
``eos_token_id`` in config.json and in generation_config.json (each may be
an int or a list); models with several end tokens list them there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from engine.config import ConfigError, looks_like_hub_id


def _load(path: str, required: bool) -> dict[str, Any]:
    if not os.path.isfile(path):
        if required:
            raise ConfigError(f"missing {path}: not a Hugging Face model directory")
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from e


def _check_exists(model_dir: str) -> None:
    """A clear word for a path that is not there, with a hint for hub ids."""
    if os.path.exists(model_dir):
        return
    hint = ""
    if looks_like_hub_id(model_dir):
        hint = (f"; {model_dir!r} looks like a Hugging Face hub id, and tprun reads local "
                f"files only: download it first (huggingface-cli download {model_dir} "
                f"--local-dir DIR) and pass --model DIR")
    raise ConfigError(f"model {model_dir!r} is not a local directory{hint}")


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


@dataclass(frozen=True)
class ModelInfo:
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int | None
    architectures: tuple[str, ...]
    dtype: str | None
    bos_token_id: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    intermediate_size: int | None = None

    @classmethod
    def from_dir(cls, model_dir: str) -> ModelInfo:
        _check_exists(model_dir)
        config = _load(os.path.join(model_dir, "config.json"), required=True)
        generation = _load(os.path.join(model_dir, "generation_config.json"), required=False)
        # Multimodal wrappers keep the language model's fields in text_config.
        text = config.get("text_config") or {}

        def field(name: str) -> Any:
            return config.get(name, text.get(name))

        vocab_size = field("vocab_size")
        if not isinstance(vocab_size, int):
            raise ConfigError(f"{model_dir}/config.json has no integer vocab_size")
        eos: list[int] = []
        for source in (field("eos_token_id"), generation.get("eos_token_id")):
            eos += [t for t in _as_ids(source) if t not in eos]
        bos = field("bos_token_id")
        if bos is None:
            bos = generation.get("bos_token_id")
        return cls(
            vocab_size=vocab_size,
            eos_token_ids=tuple(eos),
            max_position_embeddings=field("max_position_embeddings"),
            architectures=tuple(config.get("architectures") or ()),
            dtype=field("torch_dtype") or field("dtype"),
            bos_token_id=bos if isinstance(bos, int) else None,
            num_attention_heads=_int_or_none(field("num_attention_heads")),
            num_key_value_heads=_int_or_none(field("num_key_value_heads")
                                             or field("num_attention_heads")),
            intermediate_size=_int_or_none(field("intermediate_size")),
        )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None
