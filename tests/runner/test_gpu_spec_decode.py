"""On CUDA: speculative decoding with the Triton kernels and the (1 + k)-token
decode graphs gives the tokens of plain decoding, and its steps never wait
for the device."""

import pytest
import torch

from engine import LLM, SamplingParams
from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
from tests.helpers.runner_steps import make_runner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}
PROMPTS = ["abcabcabcabcabcabc", "the cat sat on the mat; the cat sat on the",
           "Quick zephyrs blow, vexing daft Jim", "1 2 3 4 5 6 7 8 9 10 11 12"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_greedy_equals_plain_on_cuda(enforce_eager):
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    outs = {}
    for name, spec in (("plain", None), ("spec", NGRAM)):
        with LLM(model="tiny", device="cuda", dtype="float32", enforce_eager=enforce_eager,
                 speculative_config=spec) as llm:
            outs[name] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
            if spec:
                stats = llm.engine.scheduler.spec_stats
    assert outs["spec"] == outs["plain"]
    assert stats.num_accepted_tokens > 0


@pytest.mark.timeout(300)
def test_spec_steps_never_sync(tmp_path):
    from checkpoint.tiny_model import ensure_tiny_model

    runner = make_runner(ensure_tiny_model(str(tmp_path)), "cuda", speculative_config=NGRAM)
    assert runner.graphs.graphs, "no (1 + k)-token decode graph was captured"
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 7, 5]
    new = NewRequestData(req_id="A", prompt_token_ids=prompt, prefill_token_ids=prompt,
                         sampling=SamplingOptions(temperature=0.7, seed=3), block_ids=[[1, 2]],
                         num_computed_tokens=0, max_tokens=16)
    plans = [SchedulerOutput(step_id=0, scheduled_new_reqs=[new],
                             num_scheduled_tokens=[len(prompt)])]
    computed = len(prompt)
    for step in (1, 2, 3):  # 1 + 3 tokens each (graph), host counts optimistic
        plans.append(SchedulerOutput(step_id=step, scheduled_cached_reqs=CachedRequestData(
            req_ids=["A"], new_block_ids=[None], num_computed_tokens=[computed]),
            num_scheduled_tokens=[4]))
        computed += 4
    runner.execute_model(plans[0])
    first = runner.sample_tokens()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    outputs = []
    try:
        for plan in plans[1:]:
            runner.execute_model(plan)
            outputs.append(runner.sample_tokens())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    rows = [first.get_output().rows()[0]] + [o.get_output().rows()[0] for o in outputs]
    assert len(rows[0]) == 1 and all(1 <= len(r) <= 4 for r in rows[1:])
