"""Speculative decoding with LoRA: a mixed batch of adapters under n-gram
and draft-model proposers, preempted or not, gives each request HF's greedy
tokens with its adapter merged into the weights, while drafts are proposed,
some accepted and some rejected. The target verifies every draft under the
request's own adapter, so the drafts' source does not change the tokens."""

import pytest

from engine import LLM, SamplingParams
from tests.helpers.lora_adapters import model_with_adapter_requests

PROMPTS = [
    [5, 17, 99, 3],
    [(7 * i) % 200 + 1 for i in range(37)],  # two full blocks of 16: prefix-cached
    list(range(1, 30)),  # longer than the token budget: chunked prefill
    [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2],  # repetitive: n-gram drafts
]
MAX_TOKENS = 24  # of the references; greedy tokens, so 8 of them are their first 8
CASES = [(lora_id, i) for lora_id in (1, None, 2, 3) for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    """The model, its three adapters' requests and HF's references."""
    return model_with_adapter_requests(tmp_path_factory.mktemp("lora"), PROMPTS, MAX_TOKENS)


def _spec(method: str, model_dir: str) -> dict:
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2,
                "prompt_lookup_min": 1}
    # The base model drafts for itself: the base's drafts pass, an adapter's
    # often fail.
    return {"method": "draft_model", "model": model_dir, "num_speculative_tokens": 2}


def _check(llm: LLM, cases: list, loras: dict, expected: dict,
           max_tokens: int = 8) -> tuple[int, int]:
    """Run ``cases`` ((adapter id or None, prompt index)) in one call, greedy,
    check each against HF; (draft tokens, accepted tokens) it verified."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    stats = llm.engine.scheduler.spec_stats
    drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
    outs = llm.generate([{"prompt_token_ids": PROMPTS[i]} for _, i in cases], params,
                        lora_request=[loras.get(lora_id) for lora_id, _ in cases])
    got = {(lora_id, i): out.outputs[0].token_ids for (lora_id, i), out in zip(cases, outs)}
    assert got == {(lora_id, i): expected[lora_id][i][:max_tokens] for lora_id, i in cases}
    return stats.num_draft_tokens - drafted, stats.num_accepted_tokens - accepted


@pytest.mark.timeout(180)
@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_mixed_adapters_match_merged_references(lora_setup, method, async_scheduling):
    model_dir, loras, expected = lora_setup
    with LLM(model=model_dir, device="cpu", enable_lora=True, max_loras=3, max_lora_rank=16,
             block_size=16, max_num_batched_tokens=24, async_scheduling=async_scheduling,
             speculative_config=_spec(method, model_dir)) as llm:
        # Adapter requests alone first: their own drafts are accepted and
        # rejected, so verification under an adapter is what is checked.
        drafted, accepted = _check(llm, [c for c in CASES if c[0] is not None], loras, expected)
        assert 0 < accepted < drafted
        drafted, accepted = _check(llm, CASES, loras, expected)
        assert 0 < accepted < drafted


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_preempted_adapter_requests_with_drafts(lora_setup, method):
    # Six blocks of 16: requests whose drafts are in flight are preempted,
    # the drafts' tokens discarded, and resumed under their adapters.
    model_dir, loras, expected = lora_setup
    with LLM(model=model_dir, device="cpu", enable_lora=True, max_loras=2, max_lora_rank=16,
             block_size=16, max_num_batched_tokens=24, max_model_len=64,
             num_gpu_blocks_override=6,
             speculative_config=_spec(method, model_dir)) as llm:
        scheduler = llm.engine.scheduler
        preempted = []  # (adapter id or None, drafts in flight or proposed)
        preempt = scheduler._preempt

        def spy(request):
            lora = request.lora_request
            in_flight = sum(step[request.req_id].num_drafts
                            for step in scheduler._in_flight.values() if request.req_id in step)
            preempted.append((lora and lora.lora_int_id, in_flight + len(request.next_drafts)))
            preempt(request)

        scheduler._preempt = spy
        drafted, accepted = _check(llm, CASES, loras, expected, max_tokens=MAX_TOKENS)
    assert 0 < accepted < drafted
    # Not vacuous: requests of every adapter were preempted with drafts pending.
    assert {1, 2, 3} <= {lora_id for lora_id, drafts in preempted if drafts}
