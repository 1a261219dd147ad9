"""End to end: LLM(model=dir, tensor_parallel_size=N) greedy tokens equal HF's."""

import pytest
import torch
import transformers  # the oracle: a test dependency, never skipped

from engine import LLM, SamplingParams
from tests.helpers.hf_models import save_with_greedy_reference, small_llama

PROMPTS = [
    [5, 17, 99, 3],
    list(range(1, 60)),  # longer than the token budget: chunked prefill
    [42],
    [(7 * i) % 200 + 1 for i in range(37)],
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def hf_llama_dir(tmp_path_factory):
    """A small random Llama with GQA, float32, saved with save_pretrained."""
    model = small_llama(0, 256, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=512, rms_norm_eps=1e-6)
    path = tmp_path_factory.mktemp("llama")
    expected = save_with_greedy_reference(model, path, PROMPTS, MAX_TOKENS)
    logprobs = []
    with torch.no_grad():
        for prompt, tokens in zip(PROMPTS, expected):
            # Log-softmax at every position that predicts a generated token.
            sequence = torch.tensor([prompt + tokens[:-1]])
            logits = model(sequence).logits[0, len(prompt) - 1:]
            logprobs.append(torch.log_softmax(logits.double(), dim=-1))
    return str(path), expected, logprobs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_greedy_tokens_match_transformers(hf_llama_dir, tp):
    path, expected, _ = hf_llama_dir
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(model=path, tensor_parallel_size=tp, device="cpu", max_num_batched_tokens=16,
             block_size=16, max_num_seqs=8) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    got = [o.outputs[0].token_ids for o in outs]
    assert got == expected
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_logprobs_match_transformers(hf_llama_dir, tp):
    # Through the worker daemons' flat replies, with chunked prefill (rows that
    # sample nothing) in the same steps as decodes.
    path, expected, hf_logprobs = hf_llama_dir
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    with LLM(model=path, tensor_parallel_size=tp, device="cpu", max_num_batched_tokens=16,
             block_size=16, max_num_seqs=8) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for out, tokens, want in zip(outs, expected, hf_logprobs, strict=True):
        completion = out.outputs[0]
        assert completion.token_ids == tokens
        assert len(completion.logprobs) == MAX_TOKENS
        for step, (token, entry) in enumerate(zip(tokens, completion.logprobs)):
            top2 = torch.topk(want[step], 2).indices.tolist()
            assert set(entry) == set(top2) | {token}
            for token_id, logprob in entry.items():
                assert logprob.logprob == pytest.approx(want[step, token_id].item(), abs=1e-4)


@pytest.fixture(scope="module")
def hf_mistral_window_dir(tmp_path_factory):
    """A small random Mistral whose sliding window (8) is shorter than every
    prompt but one, float32."""
    config = transformers.MistralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-6, sliding_window=8, bos_token_id=0, eos_token_id=255,
    )
    torch.manual_seed(1)
    model = transformers.MistralForCausalLM(config)
    path = tmp_path_factory.mktemp("mistral")
    return str(path), save_with_greedy_reference(model, path, PROMPTS, MAX_TOKENS)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sliding_window_model_matches_transformers(hf_mistral_window_dir):
    path, expected = hf_mistral_window_dir
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(model=path, tensor_parallel_size=2, device="cpu", max_num_batched_tokens=16,
             block_size=16, max_num_seqs=8) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert [o.outputs[0].token_ids for o in outs] == expected
