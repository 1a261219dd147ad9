"""What one engine step hands the executor, and when: an empty plan never
leaves the engine; ``step(after_send=...)`` runs once the plan is out and
before the wait for an output; the serving loop's acceptances wait for it
but always precede the request's deltas."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from ipc.engine_messages import AbortRequest, GenerateRequest, Outputs, RequestAccepted
from ipc.serde import encode
from serving.endpoint import Endpoint, EngineServer

PROMPTS = [{"prompt_token_ids": [5, 9, 2, 7]}, {"prompt_token_ids": [3, 3, 8]}]


def _watch(engine, events: list):
    """Record each plan the executor gets (``sent``), each wait for an
    output (``wait``), and every plan the scheduler makes."""
    plans = []
    execute, schedule = engine.executor.execute_model, engine.scheduler.schedule

    def watched_schedule():
        plans.append(schedule())
        return plans[-1]

    def watched_execute(plan):
        events.append(("sent", plan.step_id, plan.is_empty()))
        future = execute(plan)
        result = future.result

        class Watched:
            def result(self, timeout=None):
                events.append(("wait", plan.step_id))
                return result(timeout)

        return Watched()

    engine.scheduler.schedule = watched_schedule
    engine.executor.execute_model = watched_execute
    return plans


def _generate(tiny_dir, async_scheduling: bool, events: list):
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    with LLM(model=tiny_dir, device="cpu", executor="uni", max_model_len=256,
             async_scheduling=async_scheduling) as llm:
        plans = _watch(llm.engine, events)
        outs = [llm.generate([p], params)[0].outputs[0].token_ids for p in PROMPTS]
    return outs, plans


@pytest.mark.timeout(120)
def test_an_empty_plan_is_settled_in_the_engine_not_sent(tiny_dir):
    sync_events, async_events = [], []
    sync_tokens, _ = _generate(tiny_dir, False, sync_events)
    async_tokens, plans = _generate(tiny_dir, True, async_events)
    # Async scheduling made plans with nothing in them (each request's last
    # token was in flight), and none of them reached the executor.
    empty = [p.step_id for p in plans if p.is_empty()]
    assert empty
    sent = [e for e in async_events if e[0] == "sent"]
    assert not any(is_empty for _, _, is_empty in sent)
    assert {step for _, step, _ in sent}.isdisjoint(empty)
    assert async_tokens == sync_tokens
    assert all(len(t) == 5 for t in async_tokens)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_after_send_runs_between_the_send_and_the_wait(tiny_dir, async_scheduling):
    events = []
    with LLM(model=tiny_dir, device="cpu", executor="uni", max_model_len=256,
             async_scheduling=async_scheduling) as llm:
        engine = llm.engine
        _watch(engine, events)
        engine.add_request(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=3,
                                                      ignore_eos=True))
        turns = 0
        while engine.has_unfinished_requests():
            engine.step(after_send=lambda: events.append(("after",)))
            turns += 1
    assert sum(e == ("after",) for e in events) == turns  # once per turn, sent or not
    for i, event in enumerate(events):
        if event[0] == "sent":  # the callback comes next, before any wait
            assert events[i + 1] == ("after",)
        if event == ("after",) and i + 1 < len(events):
            assert events[i + 1][0] in ("wait", "sent")


@pytest.fixture
def server(tiny_dir):
    llm = LLM(model=tiny_dir, device="cpu", executor="uni", max_model_len=256)
    served = EngineServer(llm.engine, Endpoint.create())
    try:
        yield served
    finally:
        served.close()
        llm.shutdown()


def _record_replies(server: EngineServer, events: list) -> None:
    execute = server.engine.executor.execute_model

    def watched_execute(plan):
        events.append("plan")
        return execute(plan)

    server.engine.executor.execute_model = watched_execute
    server._reply = lambda identity, message: events.append(type(message).__name__)


def _generate_request(request_id: str, max_tokens: int) -> bytes:
    return encode(GenerateRequest(
        request_id=request_id, prompt_token_ids=[5, 9, 2, 7],
        sampling_params={"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}))


@pytest.mark.timeout(120)
def test_acceptance_goes_after_the_plan_and_before_the_deltas(server):
    events = []
    _record_replies(server, events)
    server._handle(b"client", _generate_request("r1", 2))
    assert events == []  # held back: the engine has not scheduled the request yet
    while server.engine.has_unfinished_requests():
        server._send_deltas(server.engine.step(after_send=server._flush_accepts))
    assert events[:2] == ["plan", RequestAccepted.__name__]
    assert events.count(Outputs.__name__) == 2  # one per token


@pytest.mark.timeout(120)
def test_an_abort_before_any_step_still_answers_acceptance_first(server):
    events = []
    _record_replies(server, events)
    server._handle(b"client", _generate_request("r1", 4))
    server._handle(b"client", encode(AbortRequest(request_id="r1")))
    assert events == [RequestAccepted.__name__, Outputs.__name__]
    assert server.accepts == []


@pytest.mark.timeout(120)
def test_a_refusal_after_a_held_acceptance_keeps_its_place(server):
    events = []
    _record_replies(server, events)
    server._handle(b"client", _generate_request("dup", 2))
    server._handle(b"client", _generate_request("dup", 2))  # the id is live: refused
    assert events == []
    server._send_deltas(server.engine.step(after_send=server._flush_accepts))
    assert events[:3] == ["plan", RequestAccepted.__name__, "RequestError"]
