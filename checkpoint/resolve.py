"""A ``--model`` argument as the model directory every process reads.

``tiny`` is written once into the cache (``tiny_model``); a GGUF file, by
path or as ``pkg:PACKAGE/FILE``, is converted once into a model directory
(``gguf_model``); anything else must be a Hugging Face model directory.
The engine then describes the directory (``description.describe``), checks
the description against its settings, and only then reads the tokenizer
(``tokenizer.Tokenizer.from_dir``), each once.
"""

from __future__ import annotations

from checkpoint.gguf_model import resolve_gguf
from checkpoint.tiny_model import ensure_tiny_model


def resolve_model_dir(model: str) -> str:
    """The directory of ``model``: ``tiny``'s, a GGUF file's converted one,
    or ``model`` itself."""
    if model == "tiny":
        return ensure_tiny_model()
    return resolve_gguf(model) or model
