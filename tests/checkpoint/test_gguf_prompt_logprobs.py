"""Prompt logprobs of SmolLM2 from its GGUF file against transformers loading
the same file (float32, CPU), over prefill chunks of 16 tokens."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.helpers.prompt_logprobs import check_prompt_logprobs, hf_prompt_logprobs


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smollm2_prompt_logprobs_match_transformers_gguf(smollm2, smollm2_hf_tokenizer,
                                                         smollm2_hf_model):
    """SmolLM2 from its GGUF file, float32, a 40-odd-token prompt over chunks
    of 16, against transformers loading the same file."""
    text = ("Question: Which planet is known as the Red Planet?\nAnswer: Mars, because of the "
            "iron oxide on its surface, which gives it a reddish look.")
    ids = smollm2_hf_tokenizer(text).input_ids
    assert len(ids) > 16
    want = hf_prompt_logprobs(smollm2_hf_model, ids)
    with LLM(model=smollm2, device="cpu", dtype="float32", max_num_seqs=2, max_model_len=256,
             max_num_batched_tokens=16) as llm:
        out = llm.generate({"prompt_token_ids": ids},
                           SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=5))[0]
    check_prompt_logprobs(out.prompt_logprobs, ids, want, 5, tol=1e-3)
