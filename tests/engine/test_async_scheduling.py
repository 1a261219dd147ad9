"""Async scheduling: step N+1 is scheduled before step N's output is absorbed.

Scheduler level: the scheduler tests' fake runner (which, like the real
runner, feeds a decode the token it sampled itself) runs each step as soon
as it is scheduled; the driver absorbs step N only after scheduling N+1.
Outputs must equal the plain reference loop and the synchronous driver.

Engine level: ``LLM(model="tiny")`` with ``async_scheduling`` on and off
must give the same tokens on a mixed workload (greedy and seeded sampling,
chunked prefills, stops by eos / stop_token_ids / max_tokens, preemption).
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict

import pytest
from hypothesis import given, settings

from checkpoint.tiny_model import ensure_tiny_model
from engine import LLM, SamplingParams
from engine.request import Request
from engine.scheduler import Scheduler
from tests.helpers.fake_runner import (
    PROMPTS,
    FakeRunner,
    admit,
    config,
    drive,
    expected,
    make_requests,
)
from tests.helpers.workloads import RANDOM_WORKLOAD


class AsyncFakeRunner(FakeRunner):
    """Runs ahead of the scheduler: when a request it holds is preempted,
    the token of a step not yet absorbed is one the scheduler discards, so a
    resumed request's prefill may lack the runner's last token."""

    def execute(self, out):
        for new in out.scheduled_new_reqs:
            history = self.history.get(new.req_id)
            if history is not None:
                prefill = new.prefill_token_ids
                assert prefill == history[: len(prefill)]
                assert len(history) - 1 <= len(prefill)
                self.history[new.req_id] = list(prefill)
        return super().execute(out)


def drive_async(sched: Scheduler, runner: FakeRunner, on_schedule=None, max_steps=5000):
    """Like ``drive``, but absorbs step N after scheduling step N+1. Returns
    the results, the SchedulerOutputs and the most placeholders a request
    had right after a ``schedule`` (2: a step fed a token not yet known)."""
    cfg = sched.config
    tokens: dict[str, list[int]] = defaultdict(list)
    reasons: dict[str, str] = {}
    outs, pending, max_placeholders = [], None, 0
    while sched.has_unfinished_requests() or pending is not None:
        assert len(outs) < max_steps, "no progress"
        sent = None
        if sched.has_unfinished_requests():
            out = sched.schedule()
            outs.append(out)
            assert out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
            assert not set(out.finished_req_ids) & set(out.scheduled_req_ids())
            assert not set(out.preempted_req_ids) & set(out.scheduled_req_ids())
            sched.kv.pool.check_invariants()
            if on_schedule is not None:
                on_schedule(sched, out, tokens)
            placeholders = [r.num_output_placeholders for r in sched.running]
            max_placeholders = max([max_placeholders, *placeholders])
            sent = (out, runner.execute(out))
        if pending is not None:
            for delta in sched.update_from_output(*pending):
                assert delta.req_id not in reasons, "a request reported after it finished"
                tokens[delta.req_id] += delta.new_token_ids
                if delta.finished:
                    reasons[delta.req_id] = delta.finish_reason
        pending = sent
    assert sched.kv.pool.num_free_blocks == cfg.num_blocks
    assert not sched._in_flight
    return {rid: (tokens[rid], reasons[rid]) for rid in reasons}, outs, max_placeholders


def run_both(cfg, make, next_token=None):
    """Results of the sync and async drivers on fresh copies of a workload."""
    kw = {} if next_token is None else {"next_token": next_token}
    results = []
    for driver, runner_cls in ((drive, FakeRunner), (drive_async, AsyncFakeRunner)):
        sched = Scheduler(cfg)
        for r in make():
            sched.add_request(r)
        res, outs, *rest = driver(sched, runner_cls(cfg, **kw))
        results.append((res, outs, rest[0] if rest else 0))
    return results


def test_async_overlaps_and_matches_sync_and_reference():
    cfg = config(max_num_batched_tokens=10)
    make = lambda: make_requests(PROMPTS, SamplingParams(max_tokens=7))  # noqa: E731
    (sync, _, _), (asy, _, max_placeholders) = run_both(cfg, make)
    assert asy == sync == expected(make(), cfg)
    assert max_placeholders == 2  # some step fed a token not yet known to the host


def test_placeholder_counts_one_token_per_running_request():
    cfg = config()
    sched = Scheduler(cfg)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=5)))
    runner = FakeRunner(cfg)
    step0 = sched.schedule()
    req = sched.requests["a"]
    assert req.num_output_placeholders == 1 and req.num_computed_tokens == 3
    out0 = runner.execute(step0)
    step1 = sched.schedule()  # before step 0's token is known
    assert (step1.scheduled_req_ids(), step1.num_scheduled_tokens) == (["a"], [1])
    assert runner.reqs["a"].computed == 3  # what step 1 starts from, the runner's own count
    assert req.num_output_placeholders == 2 and req.num_computed_tokens == 4
    assert req.num_tokens == 3
    out1 = runner.execute(step1)
    assert len(sched.update_from_output(step0, out0)[0].new_token_ids) == 1
    assert req.num_output_placeholders == 1 and req.num_tokens == 4
    sched.update_from_output(step1, out1)
    assert req.num_output_placeholders == 0 and req.num_tokens == 5


@pytest.mark.parametrize(
    "kw, eos, want_tokens, want_reason",
    [
        (dict(max_tokens=20), 6, [3, 4, 5, 6], "stop"),
        (dict(max_tokens=20, stop_token_ids=[5]), None, [3, 4, 5], "stop"),
        (dict(max_tokens=4, ignore_eos=True), 5, [3, 4, 5, 6], "length"),
        (dict(max_tokens=1), None, [3], "length"),
        (dict(max_tokens=20), None, [3, 4, 5, 6, 7], "length"),  # max_model_len 8
    ],
)
def test_stops_with_a_step_in_flight(kw, eos, want_tokens, want_reason):
    """A stop seen in step N's output discards step N+1's token; the request
    is reported finished once; a length limit is never overshot."""

    def position(tokens):
        return len(tokens)

    cfg = config(max_model_len=8)

    def make():
        return [Request("a", [40, 41, 42], SamplingParams(**kw), eos_token_id=eos)]

    (sync, _, _), (asy, outs, _) = run_both(cfg, make, next_token=position)
    assert asy == sync == {"a": (want_tokens, want_reason)}
    sampled_steps = sum("a" in o.scheduled_req_ids() for o in outs)
    if want_reason == "length":  # no step samples past the limit
        assert sampled_steps == len(want_tokens)
    else:  # the step after the stop was in flight: its token was discarded
        assert sampled_steps == len(want_tokens) + 1


@pytest.mark.parametrize("prefix", [False, True])
def test_preemption_with_a_step_in_flight(prefix):
    """A preempted request's in-flight token is discarded; it comes back as a
    new request whose prefill is the prompt + the outputs known then."""
    params = SamplingParams(max_tokens=12)
    cfg = config(num_blocks=8, max_model_len=32, enable_prefix_caching=prefix)
    resumed = []

    def check(sched, out, tokens):
        for new in out.scheduled_new_reqs:
            req = sched.requests[new.req_id]
            if req.num_preemptions:
                resumed.append(new.req_id)
                assert new.prefill_token_ids == req.prompt_token_ids + tokens[new.req_id]

    sched = Scheduler(cfg)
    for r in make_requests(PROMPTS[:4], params):
        sched.add_request(r)
    results, _, _ = drive_async(sched, AsyncFakeRunner(cfg), on_schedule=check)
    assert sched.num_preemptions > 0 and resumed
    assert results == expected(make_requests(PROMPTS[:4], params), cfg)


def test_abort_with_steps_in_flight_frees_blocks():
    cfg = config()
    sched = Scheduler(cfg)
    runner = FakeRunner(cfg)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=10)))
    sched.add_request(Request("b", [4, 5], SamplingParams(max_tokens=3)))
    step0 = sched.schedule()
    out0 = runner.execute(step0)
    step1 = sched.schedule()
    out1 = runner.execute(step1)
    deltas = sched.update_from_output(step0, out0)
    assert {d.req_id for d in deltas} == {"a", "b"}
    sched.abort_requests("a")  # between steps, with step 1 in flight
    assert sched.kv.get_block_ids("a") == []
    assert [d.req_id for d in sched.update_from_output(step1, out1)] == ["b"]
    step2 = sched.schedule()
    assert step2.finished_req_ids == ["a"] and "a" not in step2.scheduled_req_ids()
    sched.kv.pool.check_invariants()


def test_abort_before_the_previous_step_is_absorbed():
    """Aborted while its last known token and a placeholder fill a block:
    only blocks of known tokens may enter the prefix cache."""
    cfg = config(block_size=4, enable_prefix_caching=True)
    sched = Scheduler(cfg)
    runner = FakeRunner(cfg)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=10)))
    step0 = sched.schedule()
    out0 = runner.execute(step0)
    step1 = sched.schedule()  # feeds position 3, the token step 0 samples
    runner.execute(step1)
    sched.abort_requests("a")
    assert sched.kv.pool.num_free_blocks == cfg.num_blocks
    assert sched.kv.pool.num_cached_blocks == 0
    assert sched.update_from_output(step0, out0) == []
    sched.kv.pool.check_invariants()


def test_each_step_is_absorbed_once():
    cfg = config()
    sched = Scheduler(cfg)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=3)))
    step0 = sched.schedule()
    out0 = FakeRunner(cfg).execute(step0)
    sched.update_from_output(step0, out0)
    with pytest.raises(ValueError, match="not in flight"):
        sched.update_from_output(step0, out0)


@settings(max_examples=40, deadline=None)
@given(*RANDOM_WORKLOAD)
def test_random_workloads_async_equals_sync(
    prompts, max_tokens, budget, num_blocks, max_seqs, prefix, policy
):
    cfg = config(max_num_batched_tokens=budget, num_blocks=num_blocks, max_num_seqs=max_seqs,
                 max_model_len=24, enable_prefix_caching=prefix, policy=policy, block_size=2)
    prompts = [p for p in prompts if len(p) < cfg.max_model_len]
    params = SamplingParams(max_tokens=max_tokens)

    def make():
        reqs = make_requests(prompts, params, eos=7, priorities=[i % 3 for i in range(len(prompts))])
        return admit(Scheduler(cfg), reqs)  # the requests this config can run at all

    (sync, _, _), (asy, _, _) = run_both(cfg, make)
    assert asy == sync == expected(make(), cfg)


# ---- through LLM(model="tiny") ------------------------------------------------

EOS_IDS = [257] + list(range(0, 259, 7))  # tiny's </s> plus common byte tokens


@pytest.fixture(scope="module")
def tiny_with_eos(tmp_path_factory):
    """The tiny model with extra end tokens (generation_config.json), so that
    greedy and sampled outputs really stop by eos."""
    path = tmp_path_factory.mktemp("tiny-eos")
    shutil.copytree(ensure_tiny_model(), path, dirs_exist_ok=True)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": EOS_IDS}, f)
    return str(path)


def mixed_workload():
    prompts, params = [], []
    for i in range(12):
        length = 5 + (i * 13) % 70  # up to 74 tokens: chunked by a budget of 32
        prompts.append({"prompt_token_ids": [(11 * i + 3 * j) % 250 + 1 for j in range(length)]})
        kind = i % 4
        if kind == 0:  # greedy, to max_tokens
            p = SamplingParams(temperature=0.0, max_tokens=10 + i, ignore_eos=True)
        elif kind == 1:  # seeded sampling, stops by eos
            p = SamplingParams(temperature=0.9, seed=100 + i, max_tokens=40)
        elif kind == 2:  # greedy, stop tokens
            p = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                               stop_token_ids=list(range(3, 259, 5)))
        else:  # seeded, top-k / top-p, eos or length
            p = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=7 * i, max_tokens=24)
        params.append(p)
    return prompts, params


def generate(model, async_scheduling, **kw):
    prompts, params = mixed_workload()
    with LLM(model=model, device="cpu", async_scheduling=async_scheduling, block_size=16,
             max_num_batched_tokens=32, max_num_seqs=8, num_gpu_blocks_override=12, max_model_len=12 * 16,
             **kw) as llm:
        scheduler = llm.engine.scheduler
        schedule, seen = scheduler.schedule, [0]

        def watched_schedule():
            out = schedule()
            seen[0] = max([seen[0], *(r.num_output_placeholders for r in scheduler.running)])
            return out

        scheduler.schedule = watched_schedule
        outs = llm.generate(prompts, params)
        stats = llm.engine.get_stats()
    assert stats.num_free_blocks == stats.num_blocks and stats.num_running == 0
    # Two placeholders: a step was sent while the previous one's token was unknown.
    assert seen[0] == (2 if async_scheduling else 1)
    results = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs]
    return results, stats, params


def check_workload(results, params):
    for (tokens, reason), p in zip(results, params):
        assert 1 <= len(tokens) <= p.max_tokens
        if reason == "length":
            assert len(tokens) == p.max_tokens
        else:
            assert reason == "stop"
            assert tokens[-1] in p.stop_token_ids or tokens[-1] in EOS_IDS
    reasons = {r for _, r in results}
    assert reasons == {"stop", "length"}


@pytest.mark.timeout(120)
def test_llm_async_on_and_off_same_tokens_tp1(tiny_with_eos):
    sync, sync_stats, params = generate(tiny_with_eos, False)
    asy, async_stats, _ = generate(tiny_with_eos, True)
    assert asy == sync
    check_workload(sync, params)
    assert sync_stats.num_preemptions > 0 and async_stats.num_preemptions > 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_llm_async_on_and_off_same_tokens_tp2(tiny_with_eos):
    sync, _, params = generate(tiny_with_eos, False, tensor_parallel_size=2, executor="mp")
    asy, async_stats, _ = generate(tiny_with_eos, True, tensor_parallel_size=2, executor="mp")
    assert asy == sync
    check_workload(sync, params)
    assert async_stats.num_preemptions > 0
