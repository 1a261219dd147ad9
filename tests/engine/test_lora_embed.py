"""LoRA on a pooling engine: LLM(runner="pooling", enable_lora=True).embed
with ``lora_request`` gives each prompt the final-normed hidden state of HF
transformers running the model with that prompt's adapter merged into its
weights (W + scale * B @ A), pooled (LAST) and normalized by hand (on
CUDA, transformers' run on the GPU too)."""

import copy

import numpy as np
import pytest
import torch

from engine import LLM, LoRARequest
from tests.helpers.devices import DEVICES
from tests.helpers.hf_models import save_spread, small_llama
from tests.helpers.lora_adapters import ALL_TARGETS, merged, write_adapter

PROMPTS = [[5, 17, 99, 3], list(range(1, 30)), [42, 7]]
# Absolute tolerance of a normalized embedding by device (float32; on CUDA
# the kernels on both sides sum in different orders).
ATOL = {"cpu": 2e-5, "cuda": 1e-4}


@pytest.fixture(scope="module")
def embed_setup(tmp_path_factory):
    """The model, one adapter on every projection, and HF's model without
    and with the adapter merged (by the adapter's key, None and "sql")."""
    root = tmp_path_factory.mktemp("lora-embed")
    model = small_llama(1, 256, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=64, rms_norm_eps=1e-6)
    path = save_spread(model, root / "model")
    adapter = write_adapter(root / "adapter", model, ALL_TARGETS, 8, 16.0, seed=7)
    return path, str(root / "adapter"), {None: model, "sql": merged(model, adapter)}


def _last_hidden(references: dict, device: str) -> dict:
    """HF's last hidden state of each prompt by adapter key, run on ``device``."""
    hidden = {}
    for key, reference in references.items():
        on_device = copy.deepcopy(reference.model).to(device)
        with torch.no_grad():
            hidden[key] = [on_device(torch.tensor([p], device=device)).last_hidden_state[0, -1]
                           .double().cpu().numpy() for p in PROMPTS]
    return hidden


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device", DEVICES)
def test_embed_runs_each_prompts_adapter(embed_setup, device):
    path, adapter_dir, references = embed_setup
    hidden = _last_hidden(references, device)
    lora = LoRARequest("sql", 1, adapter_dir)
    cases = [("sql", 0), (None, 0), ("sql", 1), (None, 1), ("sql", 2)]
    with LLM(model=path, device=device, runner="pooling", block_size=16, max_num_seqs=8,
             max_num_batched_tokens=16, enable_lora=True, max_lora_rank=8) as llm:
        outs = llm.embed([{"prompt_token_ids": PROMPTS[i]} for _, i in cases],
                         lora_request=[lora if key else None for key, _ in cases])
    for out, (key, i) in zip(outs, cases, strict=True):
        want = hidden[key][i] / np.linalg.norm(hidden[key][i])
        np.testing.assert_allclose(np.array(out.outputs.embedding), want, atol=ATOL[device])
    # The adapter changes the embedding (the check above is not of the base alone).
    assert not np.allclose(hidden["sql"][0], hidden[None][0], atol=1e-3)
