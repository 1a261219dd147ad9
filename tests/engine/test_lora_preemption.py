"""LoRA requests preempted by recompute and resumed: with a KV cache of six
blocks, a mixed batch of adapters is preempted again and again (under fcfs
and priority, one and two adapter slots, async and sync scheduling), and
each request still gives HF's greedy tokens with its adapter merged into
the weights. A resumed request recomputes prompt + outputs under its own
adapter, in whichever slot it gets back."""

import pytest

from engine import LLM, SamplingParams
from tests.helpers.lora_adapters import model_with_adapter_requests

PROMPTS = [[5, 17, 99, 3], [(7 * i) % 200 + 1 for i in range(20)], list(range(1, 25))]
MAX_TOKENS = 24
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
# Each prompt under adapters 1, none, 2, 3 and 1 again, in this order.
CASES = [(lora_id, i) for lora_id in (1, None, 2, 3, 1) for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    """The model, its three adapters' requests and HF's references."""
    return model_with_adapter_requests(tmp_path_factory.mktemp("lora"), PROMPTS, MAX_TOKENS)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("max_loras", "policy", "async_scheduling"), [
    (1, "fcfs", True), (2, "fcfs", True), (2, "priority", True), (1, "fcfs", False)])
def test_preempted_adapter_requests_match_merged_references(lora_setup, max_loras, policy,
                                                            async_scheduling):
    model_dir, loras, expected = lora_setup
    # Six blocks of 16 hold one request of up to 48 tokens and a little more.
    with LLM(model=model_dir, device="cpu", enable_lora=True, max_loras=max_loras,
             max_lora_rank=16, block_size=16, max_num_batched_tokens=24, max_model_len=64,
             num_gpu_blocks_override=6, scheduling_policy=policy,
             async_scheduling=async_scheduling) as llm:
        scheduler = llm.engine.scheduler
        preempted = []
        preempt = scheduler._preempt

        def spy(request):
            preempted.append(request.lora_request and request.lora_request.lora_int_id)
            preempt(request)

        scheduler._preempt = spy
        # Under priority a later request ranks higher (lower value), so
        # arrivals keep preempting the requests that came before them.
        priority = list(range(len(CASES), 0, -1)) if policy == "priority" else None
        outs = llm.generate([{"prompt_token_ids": PROMPTS[i]} for _, i in CASES], PARAMS,
                            lora_request=[loras.get(lora_id) for lora_id, _ in CASES],
                            priority=priority)
        num_preemptions = scheduler.num_preemptions
    got = {(lora_id, i, n): out.outputs[0].token_ids
           for n, ((lora_id, i), out) in enumerate(zip(CASES, outs))}
    assert got == {(lora_id, i, n): expected[lora_id][i]
                   for n, (lora_id, i) in enumerate(CASES)}
    # Not vacuous: requests of every adapter were preempted and resumed.
    assert num_preemptions == len(preempted)
    assert {1, 2, 3} <= set(preempted)
