"""The two-call step through both executors: a plan with constrained requests
samples only once its GrammarBitmask arrives, and samples under it (a mask
allowing one token makes greedy sampling pick that token); the next plan
may come before the awaited bitmask and runs once that step has sampled; a
bitmask that does not fit the step, or comes for no step, or does not come
before a second plan, rejects its step on every rank without stopping the
workers."""

from __future__ import annotations

import pytest

from executor.base import StepRejected
from executor.multiproc import MultiprocExecutor
from executor.uniproc import UniprocExecutor
from ipc.messages import (
    CachedRequestData,
    GrammarBitmask,
    NewRequestData,
    SamplingOptions,
    SchedulerOutput,
)
from tests.helpers.checkpoints import runner_config
from tests.helpers.grammar_masks import mask_message

VOCAB = 320  # tiny's


def _executor(kind: str, tiny_dir):
    executor = UniprocExecutor("cpu") if kind == "uni" else MultiprocExecutor(2, "cpu")
    executor.initialize(runner_config(tiny_dir, max_num_seqs=4, max_num_batched_tokens=64,
                                      max_model_len=256), 32)
    return executor


def _plan(step_id: int, req_ids: list[str], constrained: list[str]) -> SchedulerOutput:
    news = [NewRequestData(req_id=r, prompt_token_ids=[1, 2, 3 + i],
                           prefill_token_ids=[1, 2, 3 + i],
                           sampling=SamplingOptions(temperature=0.0), block_ids=[[i]],
                           num_computed_tokens=0, max_tokens=4)
            for i, r in enumerate(req_ids)]
    return SchedulerOutput(step_id=step_id, scheduled_new_reqs=news,
                           num_scheduled_tokens=[3] * len(req_ids),
                           structured_output_req_ids=constrained)


def _only(step_id: int, allowed: dict[str, int], width: int = VOCAB) -> GrammarBitmask:
    """A bitmask letting each request sample exactly one token."""
    return mask_message(step_id, {r: [t] for r, t in allowed.items()}, width)


@pytest.fixture(params=["uni", pytest.param("mp", marks=pytest.mark.slow)])
def executor(request, tiny_dir):
    executor = _executor(request.param, tiny_dir)
    yield executor
    executor.shutdown()


@pytest.mark.timeout(120)
def test_masked_rows_sample_the_allowed_token(executor):
    future = executor.execute_model(_plan(0, ["a", "b", "c"], ["c", "a"]))
    executor.sample_tokens(_only(0, {"c": 300, "a": 65}))
    out = future.result(timeout=60)
    tokens = [row[0] for row in out.rows()]
    assert tokens[0] == 65 and tokens[2] == 300  # plan order: a, b, c
    unmasked = executor.execute_model(_plan(1, ["d"], [])).result(timeout=60)
    assert len(unmasked.rows()) == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad, pattern", [
    (_only(0, {"a": 65}, width=VOCAB + 64), "bytes, not"),
    (_only(0, {"a": 65, "zz": 1}), r"unknown: \['zz'\]"),
    (_only(0, {}), r"missing: \['a'\]"),
])
def test_a_bitmask_that_does_not_fit_rejects_the_step(executor, bad, pattern):
    future = executor.execute_model(_plan(0, ["a"], ["a"]))
    executor.sample_tokens(bad)
    with pytest.raises(StepRejected, match=pattern):
        future.result(timeout=60)
    out = executor.execute_model(_plan(1, ["b"], ["b"]))
    executor.sample_tokens(_only(1, {"b": 7}))
    assert out.result(timeout=60).rows() == [[7]]


def _decode(step_id: int, req_ids: list[str], constrained: list[str]) -> SchedulerOutput:
    """One more token for each request of ``_plan`` (its blocks have room)."""
    cached = CachedRequestData(req_ids=req_ids, new_block_ids=[None] * len(req_ids))
    return SchedulerOutput(step_id=step_id, scheduled_cached_reqs=cached,
                           num_scheduled_tokens=[1] * len(req_ids),
                           structured_output_req_ids=constrained)


@pytest.mark.timeout(120)
def test_a_plan_before_the_awaited_bitmask_runs_after_that_step_samples(executor):
    """The engine sends step N+1's plan before step N's bitmask: the rank
    keeps the plan and runs it once N has sampled, so N+1's decode feeds the
    token the mask forced (greedy sampling of a masked row picks it)."""
    first = executor.execute_model(_plan(0, ["a", "b"], ["a"]))
    second = executor.execute_model(_decode(1, ["a", "b"], ["b"]))
    executor.sample_tokens(_only(0, {"a": 65}))
    assert first.result(timeout=60).rows()[0] == [65]
    third = executor.execute_model(_decode(2, ["a", "b"], []))  # kept again: 1 awaits its mask
    executor.sample_tokens(_only(1, {"b": 300}))
    assert second.result(timeout=60).rows()[1] == [300]
    assert len(third.result(timeout=60).rows()) == 2
    # The same steps with nothing kept (each bitmask before the next plan)
    # give the same tokens: keeping a plan changes no result.
    _finish(executor, 3, ["a", "b"])
    again = [executor.execute_model(_plan(4, ["a", "b"], ["a"]))]
    executor.sample_tokens(_only(4, {"a": 65}))
    again.append(executor.execute_model(_decode(5, ["a", "b"], ["b"])))
    executor.sample_tokens(_only(5, {"b": 300}))
    again.append(executor.execute_model(_decode(6, ["a", "b"], [])))
    outs = [f.result(timeout=60).rows() for f in (first, second, third)]
    assert [f.result(timeout=60).rows() for f in again] == outs


def _finish(executor, step_id: int, req_ids: list[str]) -> None:
    executor.execute_model(SchedulerOutput(step_id=step_id, finished_req_ids=req_ids)
                           ).result(timeout=60)


@pytest.mark.timeout(120)
def test_a_missing_bitmask_rejects_its_step_and_the_kept_plan_runs(executor):
    """Two plans while a bitmask is due: that bitmask is not coming. The
    waiting step is rejected (on every rank), the kept plan and the new one
    run in order, and the workers keep serving."""
    waiting = executor.execute_model(_plan(0, ["a"], ["a"]))
    kept = executor.execute_model(_plan(1, ["b"], []))
    plain = executor.execute_model(_plan(2, ["c"], []))
    with pytest.raises(StepRejected, match="step 0 .*bitmask did not come before step 2"):
        waiting.result(timeout=60)
    assert len(kept.result(timeout=60).rows()) == 1
    assert len(plain.result(timeout=60).rows()) == 1


@pytest.mark.timeout(120)
def test_a_bad_bitmask_with_a_plan_kept_rejects_only_its_step(executor):
    """The bitmask of the awaited step does not fit it: that step is
    rejected; the plan kept behind it still runs, and so do later steps."""
    waiting = executor.execute_model(_plan(0, ["a"], ["a"]))
    kept = executor.execute_model(_plan(1, ["b"], ["b"]))
    executor.sample_tokens(_only(0, {"a": 65}, width=VOCAB + 64))
    with pytest.raises(StepRejected, match="step 0 .*bytes, not"):
        waiting.result(timeout=60)
    executor.sample_tokens(_only(1, {"b": 7}))
    assert kept.result(timeout=60).rows() == [[7]]


@pytest.mark.timeout(120)
def test_a_bitmask_for_another_step_is_rejected_and_the_awaited_step_still_waits(executor):
    waiting = executor.execute_model(_plan(0, ["a"], ["a"]))
    stray = executor.execute_model(_plan(1, ["b"], []))  # kept
    executor.sample_tokens(_only(7, {"a": 65}))
    executor.sample_tokens(_only(0, {"a": 65}))
    assert waiting.result(timeout=60).rows() == [[65]]
    assert len(stray.result(timeout=60).rows()) == 1


@pytest.mark.timeout(120)
def test_constrained_ids_must_be_scheduled(executor):
    with pytest.raises(StepRejected, match=r"names requests not scheduled: \['x'\]"):
        executor.execute_model(_plan(0, ["a"], ["a", "x"])).result(timeout=60)
