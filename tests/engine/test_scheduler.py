"""Scheduler tests against a fake runner that keeps its own state.

The fake runner (tests/helpers/fake_runner.py) plays the runner's side of
the protocol: it holds the requests it was sent, a simulated paged KV cache
(slot -> token written there) and checks, before every sample, that the
request's KV blocks hold exactly its tokens. Its next token is a function of
the whole sequence, so a wrong prefill, a lost token or a bad block table
changes the outputs, which are compared with a plain loop that knows nothing
of scheduling.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings

from engine.outputs import Logprob
from engine.prompt_logprobs import ENTRIES_PER_STEP, entries_per_position
from engine.request import ContextLengthError, Request, RequestStatus, check_request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from ipc.messages import Logprobs, ModelRunnerOutput
from tests.helpers.fake_runner import (
    PROMPTS,
    FakeRunner,
    admit,
    config,
    drive,
    expected,
    hash_token,
    make_requests,
    run,
)
from tests.helpers.workloads import RANDOM_WORKLOAD


@pytest.mark.parametrize("prefix", [False, True])
def test_chunked_prefill_respects_budget(prefix):
    cfg = config(max_num_batched_tokens=6, enable_prefix_caching=prefix)
    reqs = make_requests(PROMPTS, SamplingParams(max_tokens=5))
    results, outs, _, runner = run(cfg, reqs)
    assert results == expected(reqs, cfg)
    assert runner.chunked_steps > 0
    assert max(o.total_num_scheduled_tokens for o in outs) == 6


@pytest.mark.parametrize("prefix", [False, True])
def test_max_num_seqs_respected(prefix):
    cfg = config(max_num_seqs=2, enable_prefix_caching=prefix)
    reqs = make_requests(PROMPTS, SamplingParams(max_tokens=4))
    results, _, _, runner = run(cfg, reqs)
    assert results == expected(reqs, cfg)
    assert runner.max_live == 2


@pytest.mark.parametrize("prefix", [False, True])
def test_preemption_with_few_blocks_matches_plenty(prefix):
    params = SamplingParams(max_tokens=12)
    small = config(num_blocks=8, max_model_len=32, enable_prefix_caching=prefix)
    results, outs, sched, _ = run(small, make_requests(PROMPTS[:4], params))
    assert sched.num_preemptions > 0
    assert any(o.preempted_req_ids for o in outs)
    plenty = config(num_blocks=256, max_model_len=32)
    results_plenty, outs_plenty, sched_plenty, _ = run(plenty, make_requests(PROMPTS[:4], params))
    assert sched_plenty.num_preemptions == 0
    assert results == results_plenty == expected(make_requests(PROMPTS[:4], params), small)


def test_resumed_request_is_new_with_generated_tokens():
    params = SamplingParams(max_tokens=12)
    cfg = config(num_blocks=8, max_model_len=32)
    reqs = make_requests(PROMPTS[:4], params)
    sched = Scheduler(cfg)
    for r in reqs:
        sched.add_request(r)
    runner = FakeRunner(cfg)
    preempted: set[str] = set()
    resumed = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        for new in out.scheduled_new_reqs:
            if new.req_id in preempted:
                resumed.append(new)
                assert new.max_tokens == 12
                assert len(new.prefill_token_ids) > len(new.prompt_token_ids)
        preempted |= set(out.preempted_req_ids)
        for rid in out.preempted_req_ids:
            assert sched.requests[rid].status == RequestStatus.PREEMPTED
            assert sched.requests[rid].num_computed_tokens == 0
        sched.update_from_output(out, runner.execute(out))
    assert resumed


@pytest.mark.parametrize(
    "kw, eos, want_tokens, want_reason",
    [
        (dict(max_tokens=20), 6, [3, 4, 5, 6], "stop"),
        (dict(max_tokens=20), {9, 5}, [3, 4, 5], "stop"),
        (dict(max_tokens=5, ignore_eos=True), 5, [3, 4, 5, 6, 7], "length"),
        (dict(max_tokens=20, stop_token_ids=[5]), None, [3, 4, 5], "stop"),
        (dict(max_tokens=20, stop_token_ids=[5], ignore_eos=True), 4, [3, 4, 5], "stop"),
        (dict(max_tokens=2), 6, [3, 4], "length"),
        (dict(max_tokens=4), 6, [3, 4, 5, 6], "stop"),
        (dict(max_tokens=20), None, [3, 4, 5, 6, 7], "length"),  # max_model_len 8
    ],
)
def test_stop_conditions(kw, eos, want_tokens, want_reason):
    def position(tokens):
        return len(tokens)

    cfg = config(max_model_len=8)
    req = Request("a", [40, 41, 42], SamplingParams(**kw), eos_token_id=eos)
    results, _, _, _ = run(cfg, [req], next_token=position)
    assert results == {"a": (want_tokens, want_reason)}


def test_abort_waiting_and_running_frees_blocks():
    cfg = config(max_num_seqs=1)
    reqs = make_requests(PROMPTS[:3], SamplingParams(max_tokens=30))
    sched = Scheduler(cfg)
    for r in reqs:
        sched.add_request(r)
    runner = FakeRunner(cfg)
    out = sched.schedule()
    assert out.scheduled_req_ids() == ["r0"]
    sched.update_from_output(out, runner.execute(out))
    assert sched.kv.pool.num_free_blocks < cfg.num_blocks
    sched.abort_requests(["r0", "r1", "unknown"])
    assert reqs[0].finish_reason == reqs[1].finish_reason == "abort"
    assert sched.kv.pool.num_free_blocks == cfg.num_blocks
    sched.kv.pool.check_invariants()
    out = sched.schedule()
    assert sorted(out.finished_req_ids) == ["r0", "r1"]
    assert out.scheduled_req_ids() == ["r2"]
    sched.abort_requests("r2")
    assert not sched.has_unfinished_requests()
    assert sched.kv.pool.num_free_blocks == cfg.num_blocks
    assert sched.schedule().finished_req_ids == ["r2"]
    assert sched.schedule().finished_req_ids == []


def test_abort_after_schedule_drops_that_steps_tokens():
    cfg = config()
    sched = Scheduler(cfg)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=5)))
    out = sched.schedule()
    runner_out = FakeRunner(cfg).execute(out)
    sched.abort_requests("a")
    assert sched.update_from_output(out, runner_out) == []


@pytest.mark.parametrize(
    "policy, priorities, want_order",
    [
        ("priority", [3, 1, 2, 1], ["r1", "r3", "r2", "r0"]),
        ("fcfs", [3, 1, 2, 1], ["r0", "r1", "r2", "r3"]),
    ],
)
def test_policy_order(policy, priorities, want_order):
    cfg = config(max_num_seqs=1, policy=policy)
    reqs = make_requests(PROMPTS[:4], SamplingParams(max_tokens=3), priorities=priorities)
    results, outs, _, _ = run(cfg, reversed(reqs))  # add order must not matter
    assert results == expected(reqs, cfg)
    order = [n.req_id for o in outs for n in o.scheduled_new_reqs]
    assert order == want_order


def test_priority_preempts_lowest_priority_first():
    cfg = config(num_blocks=6, max_num_batched_tokens=64, policy="priority", max_model_len=24)
    params = SamplingParams(max_tokens=12)
    prompts = [[1, 2, 3, 4, 5]] * 3
    reqs = make_requests(prompts, params, priorities=[2, 0, 1])
    results, outs, _, _ = run(cfg, reqs)
    preempted = [rid for o in outs for rid in o.preempted_req_ids]
    assert preempted and preempted[0] == "r0"
    assert "r1" not in preempted
    assert results == expected(reqs, cfg)


@pytest.mark.parametrize(
    "prompt, max_tokens, match",
    [
        ([], 4, "prompt is empty"),
        (list(range(16)), 4, "= 20 exceeds max_model_len 16"),
        (list(range(10)), 6, "may need 4 KV blocks"),
        (list(range(10)), 8, "exceeds max_model_len 16"),
        (list(range(13)), 1, "may need 4 KV blocks"),
    ],
)
def test_invalid_requests_rejected(prompt, max_tokens, match):
    with pytest.raises(ValueError, match=match):
        check_request(prompt, SamplingParams(max_tokens=max_tokens),
                      config(max_model_len=16, num_blocks=3))


def test_the_context_error_is_openais_with_the_engines_words():
    """Hand-worked: 16 + 4 = 20 > 16. The message an HTTP chat or completion
    client reads, word for word, with OpenAI's code."""
    with pytest.raises(ContextLengthError) as raised:
        check_request(list(range(16)), SamplingParams(max_tokens=4),
                      config(max_model_len=16, num_blocks=8))
    assert str(raised.value) == ("prompt (16 tokens) + max_tokens (4) = 20 exceeds max_model_len "
                                 "16, this model's maximum context length")
    assert raised.value.code == "context_length_exceeded"
    check_request(list(range(12)), SamplingParams(max_tokens=4),
                  config(max_model_len=16, num_blocks=8))  # 16: fits


def test_request_that_just_fits_is_accepted_and_completes():
    cfg = config(max_model_len=13, num_blocks=3)  # 12 KV tokens at most: 3 blocks
    reqs = [
        Request("a", list(range(12)), SamplingParams(max_tokens=1)),
        Request("b", list(range(5)), SamplingParams(max_tokens=50)),
    ]
    results, _, _, _ = run(cfg, reqs)
    assert results == expected(reqs, cfg)
    assert results["b"][1] == "length" and len(results["b"][0]) == 8


def test_duplicate_request_id_rejected():
    sched = Scheduler(config())
    sched.add_request(Request("x", [1], SamplingParams()))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(Request("x", [2], SamplingParams()))


def test_config_defaults_are_the_engine_configs(tiny_dir):
    from checkpoint.description import describe
    from engine.config import EngineConfig

    cfg = EngineConfig(model=tiny_dir).scheduler_config(describe(tiny_dir), num_blocks=1)
    assert (cfg.policy, cfg.enable_prefix_caching, cfg.max_logprobs) == ("fcfs", True, 20)


def test_step_mismatch_raises():
    sched = Scheduler(config())
    sched.add_request(Request("x", [1], SamplingParams()))
    out = sched.schedule()
    with pytest.raises(ValueError, match="step"):
        sched.update_from_output(
            out, ModelRunnerOutput(step_id=5, sampled_token_ids=[1])
        )


def test_reply_row_count_mismatch_raises():
    sched = Scheduler(config())
    sched.add_request(Request("x", [1], SamplingParams()))
    sched.add_request(Request("y", [2], SamplingParams()))
    out = sched.schedule()
    with pytest.raises(ValueError, match="1 rows for 2 scheduled requests"):
        sched.update_from_output(out, ModelRunnerOutput(step_id=out.step_id, sampled_token_ids=[1]))


def test_logprobs_follow_sampled_tokens():
    sched = Scheduler(config())
    sched.add_request(Request("a", [1, 2], SamplingParams(logprobs=1, max_tokens=1)))
    sched.add_request(Request("b", [3], SamplingParams(max_tokens=4)))
    out = sched.schedule()
    logprobs = Logprobs(
        top_token_ids=[[7], [8]],
        top_logprobs=[[-0.1], [-0.2]],
        sampled_logprobs=[-0.5, -0.2],
        sampled_ranks=[2, 1],
    )
    assert out.scheduled_req_ids() == ["a", "b"]  # the reply's row order
    runner_out = ModelRunnerOutput(step_id=out.step_id, sampled_token_ids=[9, 8], logprobs=logprobs)
    deltas = {d.req_id: d for d in sched.update_from_output(out, runner_out)}
    assert deltas["a"].logprobs == [{7: Logprob(-0.1, 1), 9: Logprob(-0.5, 2)}]
    assert deltas["a"].finish_reason == "length"
    assert deltas["b"].logprobs is None


def test_prefix_cache_hits_skip_prefill():
    cfg = config(enable_prefix_caching=True, max_num_seqs=1)
    shared = list(range(10, 22))  # 3 full blocks of 4
    prompts = [shared + [1, 2, 3], shared + [4, 5], shared]
    reqs = make_requests(prompts, SamplingParams(max_tokens=3))
    results, outs, sched, _ = run(cfg, reqs)
    assert results == expected(reqs, cfg)
    computed = {n.req_id: n.num_computed_tokens for o in outs for n in o.scheduled_new_reqs}
    # r2's prompt is exactly the shared blocks: its last block is left to compute.
    assert computed == {"r0": 0, "r1": 12, "r2": 8}
    assert sched.kv.prefix_queries == 15 + 14 + 12
    assert sched.kv.prefix_hits == 20


@settings(max_examples=40, deadline=None)
@given(*RANDOM_WORKLOAD)
def test_random_workloads_match_reference(
    prompts, max_tokens, budget, num_blocks, max_seqs, prefix, policy
):
    cfg = config(
        max_num_batched_tokens=budget,
        num_blocks=num_blocks,
        max_num_seqs=max_seqs,
        max_model_len=24,
        enable_prefix_caching=prefix,
        policy=policy,
        block_size=2,
    )
    prompts = [p for p in prompts if len(p) < cfg.max_model_len]
    params = SamplingParams(max_tokens=max_tokens)
    reqs = make_requests(prompts, params, eos=7, priorities=[i % 3 for i in range(len(prompts))])
    sched = Scheduler(cfg)
    accepted = admit(sched, reqs)
    results, _ = drive(sched, FakeRunner(cfg))
    assert results == expected(accepted, cfg)


def test_queued_and_first_scheduled_times_survive_preemption():
    """``queued_ts`` is when ``add_request`` ran; ``scheduled_ts`` lies within
    the ``schedule`` call that first admitted the request, even for one
    preempted and admitted again later (vLLM's rule: the first time)."""
    cfg = config(num_blocks=8, max_model_len=32)
    reqs = make_requests(PROMPTS[:4], SamplingParams(max_tokens=12))
    sched, runner = Scheduler(cfg), FakeRunner(cfg, hash_token)
    added = {}
    for r in reqs:
        before = time.monotonic()
        sched.add_request(r)
        added[r.req_id] = (before, time.monotonic())
    first_admitted: dict[str, tuple[float, float]] = {}
    admissions: dict[str, int] = {}
    while sched.has_unfinished_requests():
        before = time.monotonic()
        out = sched.schedule()
        after = time.monotonic()
        for new in out.scheduled_new_reqs:
            first_admitted.setdefault(new.req_id, (before, after))
            admissions[new.req_id] = admissions.get(new.req_id, 0) + 1
        sched.update_from_output(out, runner.execute(out))
    assert max(admissions.values()) > 1  # some request was preempted and came back
    for r in reqs:
        assert added[r.req_id][0] <= r.queued_ts <= added[r.req_id][1]
        start, end = first_admitted[r.req_id]
        assert start <= r.scheduled_ts <= end


# A 128k-token vocabulary: a whole-vocabulary position sends 131073 entries,
# so 15 positions fit a step's 2**21 (16 would be 2097168).
WIDE_VOCAB = 131072


def _scoring(req_id: str, prompt_len: int, num_top: int, arrival: float = 0.0) -> Request:
    params = SamplingParams(max_tokens=2, prompt_logprobs=num_top)
    return Request(req_id, [(3 * j + 1) % 50 for j in range(prompt_len)], params,
                   arrival_time=arrival,
                   prompt_logprob_width=entries_per_position(num_top, WIDE_VOCAB))


def _chunks(outs, req_id: str) -> list[int]:
    return [n for out in outs for r, n in zip(out.scheduled_req_ids(), out.num_scheduled_tokens)
            if r == req_id]


def test_prompt_logprob_entries_bound_each_steps_prefill():
    """Hand-worked with the real bound: 15 whole-vocabulary positions a
    step, so a 50-token prompt (49 scored positions) prefills in 15, 15, 15
    and 5 tokens (the last chunk scores 4), then decodes; 5 top entries a
    position never bind before the token budget (64) does. The outputs are
    the unscheduled reference's."""
    assert ENTRIES_PER_STEP == 1 << 21
    cfg = config()
    whole = [_scoring("r0", 50, -1)]
    results, outs, _, _ = run(cfg, whole)
    assert _chunks(outs, "r0") == [15, 15, 15, 5, 1]
    assert results == expected(whole, cfg)
    few = [_scoring("r0", 50, 5)]
    results, outs, _, _ = run(cfg, few)
    assert _chunks(outs, "r0") == [50, 1]
    assert results == expected(few, cfg)


def test_the_widest_request_sets_every_scored_rows_width():
    """The runner computes a step's scored rows as wide as the widest, so a
    5-top request beside a whole-vocabulary one shares its 15 rows: it
    waits until the wide one scores 4 in its last chunk, takes the 11 rows
    left, then the rest of its prompt at once in the next step."""
    cfg = config()
    reqs = [_scoring("r0", 50, -1), _scoring("r1", 40, 5, arrival=1.0)]
    results, outs, _, _ = run(cfg, reqs)
    assert _chunks(outs, "r0") == [15, 15, 15, 5, 1]
    assert _chunks(outs, "r1") == [11, 29, 1]
    assert [o.scheduled_req_ids() for o in outs[:5]] == [["r0"]] * 3 + [["r0", "r1"]] * 2
    assert results == expected(reqs, cfg)
