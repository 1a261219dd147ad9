"""LoRA on a pooling engine: LLM(runner="pooling", enable_lora=True).embed
with ``lora_request`` gives each prompt the final-normed hidden state of HF
transformers running the model with that prompt's adapter merged into its
weights (W + scale * B @ A), pooled (LAST) and normalized by hand."""

import numpy as np
import pytest
import torch

from engine import LLM, LoRARequest
from tests.helpers.hf_models import save_spread, small_llama
from tests.helpers.lora_adapters import ALL_TARGETS, merged, write_adapter

PROMPTS = [[5, 17, 99, 3], list(range(1, 30)), [42, 7]]


@pytest.fixture(scope="module")
def embed_setup(tmp_path_factory):
    """The model, one adapter on every projection, and HF's last hidden
    state of each prompt without and with the adapter."""
    root = tmp_path_factory.mktemp("lora-embed")
    model = small_llama(1, 256, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=64, rms_norm_eps=1e-6)
    path = save_spread(model, root / "model")
    adapter = write_adapter(root / "adapter", model, ALL_TARGETS, 8, 16.0, seed=7)
    hidden = {}
    for key, reference in ((None, model), ("sql", merged(model, adapter))):
        with torch.no_grad():
            hidden[key] = [reference.model(torch.tensor([p])).last_hidden_state[0, -1]
                           .double().numpy() for p in PROMPTS]
    return path, str(root / "adapter"), hidden


@pytest.mark.timeout(180)
def test_embed_runs_each_prompts_adapter(embed_setup):
    path, adapter_dir, hidden = embed_setup
    lora = LoRARequest("sql", 1, adapter_dir)
    cases = [("sql", 0), (None, 0), ("sql", 1), (None, 1), ("sql", 2)]
    with LLM(model=path, device="cpu", runner="pooling", block_size=16, max_num_seqs=8,
             max_num_batched_tokens=16, enable_lora=True, max_lora_rank=8) as llm:
        outs = llm.embed([{"prompt_token_ids": PROMPTS[i]} for _, i in cases],
                         lora_request=[lora if key else None for key, _ in cases])
    for out, (key, i) in zip(outs, cases, strict=True):
        want = hidden[key][i] / np.linalg.norm(hidden[key][i])
        np.testing.assert_allclose(np.array(out.outputs.embedding), want, atol=2e-5)
    # The adapter changes the embedding (the check above is not of the base alone).
    assert not np.allclose(hidden["sql"][0], hidden[None][0], atol=1e-3)
