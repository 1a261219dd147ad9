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


def _load(path: str, required: bool) -> dict[str, Any]:
    if not os.path.isfile(path):
        if required:
            raise FileNotFoundError(f"missing {path}: not a Hugging Face model directory")
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


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

    @classmethod
    def from_dir(cls, model_dir: str) -> ModelInfo:
        config = _load(os.path.join(model_dir, "config.json"), required=True)
        generation = _load(os.path.join(model_dir, "generation_config.json"), required=False)
        # Multimodal wrappers keep the language model's fields in text_config.
        text = config.get("text_config") or {}

        def field(name: str) -> Any:
            return config.get(name, text.get(name))

        vocab_size = field("vocab_size")
        if not isinstance(vocab_size, int):
            raise ValueError(f"{model_dir}/config.json has no integer vocab_size")
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
        )
