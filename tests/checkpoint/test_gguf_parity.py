"""End to end: SmolLM2's GGUF file through tprun gives transformers' greedy
tokens (transformers loading the same file), float32 on CPU, at TP=1 and
TP=3 (9 query heads, 3 KV heads: one KV head per rank)."""

from __future__ import annotations

import pytest
import torch
import transformers  # noqa: F401  (the oracle: a test dependency, never skipped)

from engine import LLM, SamplingParams

PROMPTS = [
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "def fibonacci(n):",
    "Les élèves de l'école ont étudié",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def reference(smollm2_hf_tokenizer, smollm2_hf_model):
    """(prompt ids, greedy continuations) from transformers."""
    tokenizer, model = smollm2_hf_tokenizer, smollm2_hf_model
    prompt_ids = [tokenizer(p).input_ids for p in PROMPTS]
    with torch.no_grad():
        outputs = [model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
                   for ids in prompt_ids]
    return prompt_ids, outputs


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("tp", [1, 3])
def test_greedy_tokens_match_transformers_gguf(reference, smollm2, tp):
    prompt_ids, expected = reference
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(model=smollm2, tensor_parallel_size=tp, device="cpu", dtype="float32",
             max_num_seqs=4, max_model_len=512) as llm:
        outs = llm.generate(PROMPTS, params)
    assert [o.prompt_token_ids for o in outs] == prompt_ids
    assert [o.outputs[0].token_ids for o in outs] == expected
