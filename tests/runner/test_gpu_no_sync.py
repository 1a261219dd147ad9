"""On CUDA: a step never waits for the device (only get_output() does)."""

import pytest
import torch

from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
from tests.helpers.runner_steps import make_runner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _runner(model_dir):
    return make_runner(model_dir, "cuda", enforce_eager=True)


def _new(req_id, prompt, blocks, temperature):
    return NewRequestData(req_id=req_id, prompt_token_ids=prompt, prefill_token_ids=prompt,
                          sampling=SamplingOptions(temperature=temperature, seed=3),
                          block_ids=[blocks], num_computed_tokens=0, max_tokens=32)


@pytest.mark.timeout(300)
def test_mixed_steps_never_sync(tmp_path):
    from checkpoint.tiny_model import ensure_tiny_model

    runner = _runner(ensure_tiny_model(str(tmp_path)))
    prompt_a, prompt_b = list(range(1, 41)), list(range(50, 57))
    plans = [
        # A's first chunk of 24 tokens, B's whole prompt.
        SchedulerOutput(step_id=0, scheduled_new_reqs=[_new("A", prompt_a, [3, 4, 5], 0.0),
                                                       _new("B", prompt_b, [9], 0.8)],
                        num_scheduled_tokens=[24, 7]),
        # A's last 16 tokens (a chunk), B decodes.
        SchedulerOutput(step_id=1, scheduled_cached_reqs=CachedRequestData(
            req_ids=["A", "B"], new_block_ids=[None, None]), num_scheduled_tokens=[16, 1]),
        # Both decode.
        SchedulerOutput(step_id=2, scheduled_cached_reqs=CachedRequestData(
            req_ids=["A", "B"], new_block_ids=[None, None]), num_scheduled_tokens=[1, 1]),
    ]
    outputs = []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for plan in plans:
            runner.execute_model(plan)
            outputs.append(runner.sample_tokens())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    results = [o.get_output() for o in outputs]
    by_step = [dict(zip(p.scheduled_req_ids(), r.rows())) for p, r in zip(plans, results)]
    assert by_step[0]["A"] == [] and len(by_step[0]["B"]) == 1
    assert len(by_step[1]["A"]) == 1 and len(by_step[2]["A"]) == 1
