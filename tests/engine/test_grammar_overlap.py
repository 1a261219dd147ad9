"""The grammar fill off the engine loop (async scheduling): step N+1's
bitmask is filled in the background while the loop returns N's deltas and
schedules and sends N+2's plan, and the workers keep that plan until N+1
has sampled.

- Seeded draws do not depend on the batch or on timing, so the overlapped
  engine must give token for token what synchronous scheduling (no overlap,
  every fill on the loop before the step samples) gives, on a mixed batch of
  constrained and unconstrained requests, at TP=1 and TP=2, also under
  preemption (a request preempted while its fill runs).
- The messages go out in the overlapped order: plan N+1 before bitmask N,
  one bitmask per constrained plan and none for the others, each fill on
  the manager's fill thread.
- A constrained request aborted while its step's fill runs: the others'
  tokens do not change, nothing else is touched.
"""

from __future__ import annotations

import threading

import pytest

from engine import LLM, SamplingParams
from tests.engine.test_structured_outputs import (
    PROMPT,
    assert_valid_json,
    choice_params,
    json_params,
    regex_params,
)


def _batch(num_json: int = 12):
    prompts, params = [], []
    for seed in range(num_json):
        prompts.append(PROMPT)
        params.append(json_params(seed))
        if seed % 4 == 0:
            prompts += ["Name and number:", "Pick a colour:", "Hello there", "Once upon"]
            params += [regex_params(seed), choice_params(seed),
                       SamplingParams(temperature=0.0, max_tokens=20),
                       SamplingParams(temperature=1.0, seed=seed, max_tokens=20)]
    return prompts, params


def _tokens(tiny_dir, async_scheduling: bool, **kw) -> list[list[int]]:
    prompts, params = _batch()
    with LLM(model=tiny_dir, device="cpu", async_scheduling=async_scheduling, **kw) as llm:
        outs = llm.generate(prompts, params)
    json_outs = [o for o, p in zip(outs, params) if p.structured_outputs is not None
                 and p.structured_outputs.json is not None]
    assert assert_valid_json(json_outs) >= len(json_outs) // 2
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.timeout(300)
def test_overlap_gives_the_tokens_of_synchronous_scheduling_tp1(tiny_dir):
    assert _tokens(tiny_dir, True, max_num_seqs=32) == _tokens(tiny_dir, False, max_num_seqs=32)


@pytest.mark.timeout(300)
def test_overlap_under_preemption_gives_the_synchronous_tokens(tiny_dir):
    kw = dict(max_num_seqs=8, num_gpu_blocks_override=24, block_size=16, max_model_len=24 * 16)
    with LLM(model=tiny_dir, device="cpu", **kw) as llm:
        prompts, params = _batch()
        llm.generate(prompts, params)
        assert llm.engine.scheduler.num_preemptions > 0
    assert _tokens(tiny_dir, True, **kw) == _tokens(tiny_dir, False, **kw)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_overlap_gives_the_tokens_of_synchronous_scheduling_tp2(tiny_dir):
    kw = dict(max_num_seqs=32, tensor_parallel_size=2)
    assert _tokens(tiny_dir, True, **kw) == _tokens(tiny_dir, False, **kw)


class _Recorder:
    """Wraps the scheduler's ``schedule``, the executor's two step calls and
    the manager's fill: the sequence of ("schedule", step), ("plan", step,
    constrained) and ("mask", step) events, and the threads the fills ran on."""

    def __init__(self, engine):
        self.log: list[tuple] = []
        self.fill_threads: set[str] = set()
        executor, manager, scheduler = engine.executor, engine.structured_outputs, engine.scheduler
        execute_model, sample_tokens, fill = (executor.execute_model, executor.sample_tokens,
                                              manager._fill)
        schedule = scheduler.schedule

        def scheduled():
            plan = schedule()
            self.log.append(("schedule", plan.step_id))
            return plan

        def plan(p):
            self.log.append(("plan", p.step_id, bool(p.structured_output_req_ids)))
            return execute_model(p)

        def mask(g):
            self.log.append(("mask", g.step_id))
            return sample_tokens(g)

        def recorded_fill(*args):
            self.fill_threads.add(threading.current_thread().name)
            return fill(*args)

        scheduler.schedule = scheduled
        executor.execute_model, executor.sample_tokens = plan, mask
        manager._fill = recorded_fill


@pytest.mark.timeout(300)
def test_plan_n_plus_1_is_scheduled_during_fill_n_and_sent_right_after_bitmask_n(tiny_dir):
    """Step N+1 is scheduled before bitmask N is awaited (while it fills, on
    the fill thread); then bitmask N goes out, and plan N+1 right after it."""
    prompts, params = _batch(num_json=4)
    with LLM(model=tiny_dir, device="cpu", max_num_seqs=32) as llm:
        recorder = _Recorder(llm.engine)
        llm.generate(prompts, params)
    log = recorder.log
    plans = {step: constrained for kind, step, *c in log if kind == "plan"
             for constrained in c}
    masks = [step for kind, step, *_ in log if kind == "mask"]
    assert sorted(masks) == sorted(s for s, c in plans.items() if c)  # one each, no other
    position = {entry: i for i, entry in enumerate(log)}
    overlapped = 0
    for step in masks:
        if step + 1 in plans:
            at = position[("mask", step)]
            assert position[("schedule", step + 1)] < at
            assert log[at + 1] == ("plan", step + 1, plans[step + 1])
            overlapped += 1
    assert overlapped >= len(masks) - 1
    assert recorder.fill_threads and all(t.startswith("grammar-fill")
                                         for t in recorder.fill_threads)


@pytest.mark.timeout(300)
def test_aborting_a_request_while_its_fill_runs_leaves_the_others_alone(tiny_dir):
    prompts, params = _batch(num_json=6)
    with LLM(model=tiny_dir, device="cpu", max_num_seqs=32) as llm:
        reference = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        engine = llm.engine
        requests = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        victim = requests[0]  # a JSON request
        tokens: dict[str, list[int]] = {r.req_id: [] for r in requests}
        reasons: dict[str, str] = {}
        aborted = False
        while engine.has_unfinished_requests():
            for delta in engine.step():
                tokens[delta.req_id] += delta.new_token_ids
                if delta.finished:
                    reasons[delta.req_id] = delta.finish_reason
            if (not aborted and engine.pending_bitmask is not None
                    and len(tokens[victim.req_id]) >= 3):
                assert victim.req_id in engine.pending_bitmask.req_ids
                for delta in engine.abort([victim.req_id]):
                    reasons[delta.req_id] = delta.finish_reason
                aborted = True
    assert aborted and reasons[victim.req_id] == "abort"
    assert tokens[victim.req_id] == reference[0][: len(tokens[victim.req_id])]
    for r, expected in zip(requests[1:], reference[1:]):
        assert tokens[r.req_id] == expected
