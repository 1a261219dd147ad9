"""The pooled vectors a pooling step's output reports
(``ModelRunnerOutput.pooled``) are checked against the step before any
request changes: a reply without the vector of a request whose prompt ran
to its end (which would leave that request unfinished forever), with one
for a request still mid-prompt or with a vector of the wrong size is a
``ValueError`` naming the fault, as a reply with the wrong rows is. A
token-level request reports its rows on every step that runs a chunk of
it (a row a token), and finishes with every chunk's rows normalized."""

import numpy as np
import pytest

from engine.pooling_params import PoolingParams
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from ipc.messages import ModelRunnerOutput
from tests.helpers.fake_runner import config

HIDDEN = 4


def _pooling_request(req_id: str, num_tokens: int) -> Request:
    request = Request(req_id, list(range(1, num_tokens + 1)),
                      SamplingParams(temperature=0.0, max_tokens=1, detokenize=False))
    request.pooling_params = PoolingParams(normalize=True)
    return request


def _step():
    """One step of a pooling scheduler: "a" (3 tokens) runs its whole
    prompt, "b" (20 tokens) only its first chunk in a budget of 8."""
    sched = Scheduler(config(max_num_batched_tokens=8, pooled_size=HIDDEN))
    sched.add_request(_pooling_request("a", 3))
    sched.add_request(_pooling_request("b", 20))
    plan = sched.schedule()
    assert plan.scheduled_req_ids() == ["a", "b"] and plan.num_scheduled_tokens == [3, 5]
    return sched, plan


def _reply(plan, pooled):
    return ModelRunnerOutput(step_id=plan.step_id, sampled_token_ids=[], num_sampled=[0, 0],
                             pooled=pooled)


VECTOR = np.array([3.0, 0.0, 4.0, 0.0], dtype="<f4")


def test_the_reported_vector_finishes_its_request_normalized():
    sched, plan = _step()
    deltas = sched.update_from_output(plan, _reply(plan, {"a": VECTOR.tobytes()}))
    assert [(d.req_id, d.finished, d.finish_reason) for d in deltas] == [("a", True, "stop")]
    np.testing.assert_array_equal(np.frombuffer(deltas[0].pooled, "<f4"),
                                  np.array([0.6, 0.0, 0.8, 0.0], dtype="<f4"))


@pytest.mark.parametrize("pooled, fault", [
    ({}, r"lacks the pooled vector of \['a'\]"),
    ({"a": VECTOR.tobytes(), "b": VECTOR.tobytes()}, r"vector for \['b'\], whose prompt"),
    ({"a": VECTOR[:3].tobytes()}, r"12 bytes for 'a', not 16"),
    ({"a": VECTOR.tobytes()[:15]}, r"15 bytes for 'a', not 16"),
])
def test_a_reply_that_breaks_the_contract_is_refused_whole(pooled, fault):
    sched, plan = _step()
    a = sched.requests["a"]
    with pytest.raises(ValueError, match=fault):
        sched.update_from_output(plan, _reply(plan, pooled))
    assert a.num_output_placeholders == 1 and sched.requests["a"] is a  # nothing changed


def test_a_generating_scheduler_takes_no_pooled_vectors():
    sched = Scheduler(config())
    sched.add_request(Request("g", [1, 2, 3], SamplingParams(max_tokens=2)))
    plan = sched.schedule()
    reply = ModelRunnerOutput(step_id=plan.step_id, sampled_token_ids=[7], num_sampled=[1],
                              pooled={"g": VECTOR.tobytes()})
    with pytest.raises(ValueError, match=r"vector for \['g'\]"):
        sched.update_from_output(plan, reply)


def _token_step():
    """"a" (3 tokens, embed) runs whole, "t" (20 tokens, token_embed) its
    first chunk of 5 in a budget of 8; the plan names "t"'s task."""
    sched = Scheduler(config(max_num_batched_tokens=8, pooled_size=HIDDEN))
    sched.add_request(_pooling_request("a", 3))
    token = _pooling_request("t", 20)
    token.pooling_params = PoolingParams(normalize=True, task="token_embed")
    sched.add_request(token)
    plan = sched.schedule()
    assert plan.num_scheduled_tokens == [3, 5]
    assert [r.pooling_task for r in plan.scheduled_new_reqs] == [None, "token_embed"]
    return sched, plan


def _rows(n: int, first: float = 1.0) -> np.ndarray:
    """n rows of HIDDEN values, each row a multiple of (3, 0, 4, 0)."""
    return (np.arange(first, first + n, dtype="<f4")[:, None] * VECTOR).astype("<f4")


def test_a_token_level_request_reports_every_chunk_and_finishes_with_all_rows():
    sched, plan = _token_step()
    deltas = sched.update_from_output(plan, _reply(plan, {"a": VECTOR.tobytes(),
                                                          "t": _rows(5).tobytes()}))
    assert [d.req_id for d in deltas] == ["a"]  # "t" is mid-prompt: no delta
    for first in (6, 14):
        plan = sched.schedule()
        n = plan.num_scheduled_tokens[0]
        reply = ModelRunnerOutput(step_id=plan.step_id, sampled_token_ids=[], num_sampled=[0],
                                  pooled={"t": _rows(n, first).tobytes()})
        deltas = sched.update_from_output(plan, reply)
    assert [(d.req_id, d.finished) for d in deltas] == [("t", True)]
    assert deltas[0].num_cached_tokens == 0
    rows = np.frombuffer(deltas[0].pooled, "<f4").reshape(20, HIDDEN)
    np.testing.assert_allclose(rows, np.tile([0.6, 0.0, 0.8, 0.0], (20, 1)), atol=1e-6)


@pytest.mark.parametrize("pooled, fault", [
    ({"a": VECTOR.tobytes()}, r"lacks the pooled vector of \['t'\]"),
    ({"a": VECTOR.tobytes(), "t": _rows(4).tobytes()},
     r"64 bytes for 't', not 80 \(5 rows of 4 float32 values\)"),
])
def test_a_token_level_reply_without_its_chunks_rows_is_refused(pooled, fault):
    sched, plan = _token_step()
    with pytest.raises(ValueError, match=fault):
        sched.update_from_output(plan, _reply(plan, pooled))
    assert sched.requests["t"].pooled_chunks == []


def test_a_preempted_token_level_request_drops_the_rows_it_had():
    sched, plan = _token_step()
    sched.update_from_output(plan, _reply(plan, {"a": VECTOR.tobytes(),
                                                 "t": _rows(5).tobytes()}))
    token = sched.requests["t"]
    assert len(token.pooled_chunks) == 1
    sched._preempt(token)
    assert token.pooled_chunks == [] and token.num_computed_tokens == 0


def test_a_step_holds_no_more_token_rows_than_one_reply_carries(monkeypatch):
    """The runner's reply carries a step's token-level rows (a row a
    scheduled token of such a request), so the scheduler holds them to
    ``MAX_POOLED_BYTES`` (here 6 rows of 4 values) however large the token
    budget: "t" (20 tokens) runs 6 a step, a sequence request ("a", one
    row) is not held back, and "u" waits for a step with room."""
    from ipc import serde

    monkeypatch.setattr(serde, "MAX_POOLED_BYTES", 6 * HIDDEN * 4)
    sched = Scheduler(config(max_num_batched_tokens=64, pooled_size=HIDDEN))
    for req_id, n, task in (("t", 20, "token_embed"), ("a", 9, None), ("u", 3, "token_embed")):
        request = _pooling_request(req_id, n)
        if task is not None:
            request.pooling_params = PoolingParams(normalize=True, task=task)
        sched.add_request(request)
    plan = sched.schedule()
    assert dict(zip(plan.scheduled_req_ids(), plan.num_scheduled_tokens)) == {"t": 6, "a": 9}
    sched.update_from_output(plan, ModelRunnerOutput(
        step_id=plan.step_id, sampled_token_ids=[], num_sampled=[0, 0],
        pooled={"t": _rows(6).tobytes(), "a": VECTOR.tobytes()}))
    plan = sched.schedule()
    assert dict(zip(plan.scheduled_req_ids(), plan.num_scheduled_tokens)) == {"t": 6}
