"""The two-call step through both executors: a plan with constrained requests
samples only once its GrammarBitmask arrives, and samples under it (a mask
allowing one token makes greedy sampling pick that token); a bitmask that
does not fit the step, or comes for no step, or a plan that comes before the
awaited bitmask, rejects the step on every rank without stopping the
workers."""

from __future__ import annotations

import numpy as np
import pytest

from executor.base import StepRejected
from executor.multiproc import MultiprocExecutor
from executor.uniproc import UniprocExecutor
from ipc.messages import GrammarBitmask, NewRequestData, SamplingOptions, SchedulerOutput
from tests.helpers.checkpoints import runner_config

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
    words = np.zeros((len(allowed), (width + 31) // 32), dtype="<u4")
    for row, token in enumerate(allowed.values()):
        words[row, token // 32] = 1 << (token % 32)
    return GrammarBitmask(step_id=step_id, req_ids=list(allowed), bitmask=words.tobytes())


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


@pytest.mark.timeout(120)
def test_a_plan_before_the_awaited_bitmask_rejects_the_waiting_step(executor):
    waiting = executor.execute_model(_plan(0, ["a"], ["a"]))
    plain = executor.execute_model(_plan(1, ["b"], []))
    with pytest.raises(StepRejected, match="step 1 came before its grammar bitmask"):
        waiting.result(timeout=60)
    assert len(plain.result(timeout=60).rows()) == 1


@pytest.mark.timeout(120)
def test_constrained_ids_must_be_scheduled(executor):
    with pytest.raises(StepRejected, match=r"names requests not scheduled: \['x'\]"):
        executor.execute_model(_plan(0, ["a"], ["a", "x"])).result(timeout=60)
