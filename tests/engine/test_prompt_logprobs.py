"""Prompt logprobs (``SamplingParams(prompt_logprobs=k)``) against transformers'
own log-softmax of the same prompt: every prompt token after the first gets
its logprob and rank, plus the k most likely tokens; chunked prefill (a
prompt longer than the step's token budget), a prefix-cache hit, a
preemption, and TP = 1 / 2 / 3 (SmolLM2 from its GGUF file:
tests/checkpoint/test_gguf_prompt_logprobs.py)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tests.helpers.hf_models import save_spread, small_llama
from tests.helpers.prompt_logprobs import check_prompt_logprobs, hf_prompt_logprobs

PROMPTS = [
    [5, 17, 99, 3],
    list(range(1, 60)),  # longer than the token budget (16): scored over four chunks
    [42],
    [(7 * i) % 200 + 1 for i in range(37)],
]


def save_llama(tmp_path_factory, name: str, **fields):
    """A small random float32 Llama saved under a fresh directory, with
    transformers' prompt logprobs of every prompt."""
    import transformers

    if "hidden_size" in fields:
        config = transformers.LlamaConfig(vocab_size=256, intermediate_size=192,
                                          num_hidden_layers=2, tie_word_embeddings=False,
                                          bos_token_id=0, eos_token_id=255,
                                          max_position_embeddings=512, **fields)
        torch.manual_seed(3)
        model = transformers.LlamaForCausalLM(config).eval()
    else:
        model = small_llama(3, 256, max_position_embeddings=512, **fields).eval()
    path = save_spread(model, tmp_path_factory.mktemp(name))
    return path, [hf_prompt_logprobs(model, p) for p in PROMPTS]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """4 query heads, 2 KV heads: TP 1 and 2."""
    return save_llama(tmp_path_factory, "llama_plp", num_attention_heads=4,
                      num_key_value_heads=2)


@pytest.fixture(scope="module")
def llama6(tmp_path_factory):
    """Hidden size 96, 6 query heads, 3 KV heads: TP 3 (one KV head per rank)."""
    return save_llama(tmp_path_factory, "llama_plp6", hidden_size=96, num_attention_heads=6,
                      num_key_value_heads=3)


def run(path, params, prompts=PROMPTS, tp=1, **kw):
    kw = {"max_num_batched_tokens": 16, "block_size": 16, "max_num_seqs": 8, **kw}
    with LLM(model=path, tensor_parallel_size=tp, device="cpu", **kw) as llm:
        return llm.generate([{"prompt_token_ids": p} for p in prompts], params), llm


@pytest.mark.timeout(180)
@pytest.mark.parametrize("k", [0, 5, 20])
def test_prompt_logprobs_match_transformers(llama, k):
    path, want = llama
    params = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=k)
    outs, _ = run(path, params)
    for out, prompt, ref in zip(outs, PROMPTS, want, strict=True):
        check_prompt_logprobs(out.prompt_logprobs, prompt, ref, k)
        assert len(out.outputs[0].token_ids) == 3


@pytest.mark.timeout(180)
def test_plain_requests_next_to_prompt_logprobs_have_none(llama):
    path, want = llama
    with LLM(model=path, device="cpu", max_num_batched_tokens=16, max_num_seqs=8) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:2]],
                            [SamplingParams(temperature=0.0, max_tokens=2),
                             SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)])
    assert outs[0].prompt_logprobs is None
    check_prompt_logprobs(outs[1].prompt_logprobs, PROMPTS[1], want[1], 1)


@pytest.mark.timeout(180)
def test_prefix_cache_hit_is_recomputed(llama):
    """A prompt whose blocks are cached still gets every entry (the request
    skips the hits), while a plain request reuses them (``num_cached_tokens``)."""
    path, want = llama
    prompt = PROMPTS[1]
    greedy = SamplingParams(temperature=0.0, max_tokens=2)
    with LLM(model=path, device="cpu", max_num_batched_tokens=16, block_size=16,
             enable_prefix_caching=True) as llm:
        first = llm.generate({"prompt_token_ids": prompt}, greedy)[0]
        again = llm.generate({"prompt_token_ids": prompt}, greedy)[0]
        scored = llm.generate({"prompt_token_ids": prompt},
                              SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3))[0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == 48  # three full blocks of 16 (the last token never hits)
    assert scored.num_cached_tokens == 0
    check_prompt_logprobs(scored.prompt_logprobs, prompt, want[1], 3)
    assert scored.outputs[0].token_ids == first.outputs[0].token_ids


@pytest.mark.timeout(180)
def test_prompt_logprobs_survive_preemption(llama):
    path, want = llama
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, prompt_logprobs=2)
    with LLM(model=path, device="cpu", max_num_batched_tokens=16, block_size=16,
             max_num_seqs=4, num_gpu_blocks_override=9, max_model_len=9 * 16) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        preemptions = llm.engine.scheduler.num_preemptions
    assert preemptions > 0
    for out, prompt, ref in zip(outs, PROMPTS, want, strict=True):
        check_prompt_logprobs(out.prompt_logprobs, prompt, ref, 2)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("tp", [2, 3])
def test_prompt_logprobs_at_tp(request, tp):
    path, want = request.getfixturevalue("llama" if tp == 2 else "llama6")
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=5)
    outs, _ = run(path, params, tp=tp)
    for out, prompt, ref in zip(outs, PROMPTS, want, strict=True):
        check_prompt_logprobs(out.prompt_logprobs, prompt, ref, 5)


def test_prompt_logprobs_above_max_logprobs_refused(llama):
    path, _ = llama
    with LLM(model=path, device="cpu", max_logprobs=4) as llm, \
            pytest.raises(ValueError, match="prompt_logprobs 5 is more than max_logprobs 4"):
        llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(prompt_logprobs=5))



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.timeout(300)
def test_prompt_logprobs_on_cuda(llama):
    """The CUDA path (Triton input kernels and the logprobs kernel, pinned
    uploads, CUDA graphs for the decode steps around the scored chunks),
    float32, chunked."""
    path, want = llama
    params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=5, min_tokens=4)
    with LLM(model=path, device="cuda", dtype="float32", max_num_batched_tokens=16,
             block_size=16, max_num_seqs=8) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for out, prompt, ref in zip(outs, PROMPTS, want, strict=True):
        check_prompt_logprobs(out.prompt_logprobs, prompt, ref, 5, tol=1e-3)
        assert len(out.outputs[0].token_ids) == 4
