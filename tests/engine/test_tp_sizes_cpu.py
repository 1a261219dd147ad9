"""Tensor parallelism at TP = 1, 2, 4, 8 over gloo on CPU: greedy tokens equal
HF transformers' at every size (8 query heads, 2 KV heads: at TP 4 and 8 the
KV heads are replicated)."""

import pytest

from engine import LLM, SamplingParams
from tests.helpers.hf_models import save_with_greedy_reference, small_llama

PROMPTS = [[3, 14, 15, 92, 65], list(range(40, 77))]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def model_and_expected(tmp_path_factory):
    model = small_llama(1, 128, num_attention_heads=8, num_key_value_heads=2,
                        max_position_embeddings=256)
    path = tmp_path_factory.mktemp("llama8h")
    return str(path), save_with_greedy_reference(model, path, PROMPTS, MAX_TOKENS)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("tp", [4, 8])
def test_greedy_tokens_match_hf_at_tp(model_and_expected, tp):
    path, expected = model_and_expected
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(model=path, tensor_parallel_size=tp, device="cpu", max_num_seqs=4,
             max_num_batched_tokens=32, kv_cache_memory_bytes=16 << 20) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in PROMPTS], params)]
    assert got == expected
