"""OpenAI's Responses API in the background (``background: true``) on
``tiny`` with the response store on, driven by the official ``openai``
client. The reference for every answer is the same request run in the
foreground (greedy): the create call returns the response "queued", with
no output; polled with ``client.responses.retrieve`` it ends as the
foreground answer (status, text, token counts), and its input items are
the foreground's. Streamed, the create call's events and the events
``retrieve(id, stream=True)`` replays (all, or after ``starting_after``)
are the foreground stream's (types, text, final response), each one of
the ``openai`` package's ``ResponseStreamEvent`` types. A client that
leaves a background stream does not end the response; ``cancel`` does:
the response is "cancelled", the engine's running count (``/metrics``)
returns to 0 with its KV cache empty, a follower's stream ends, and the
server goes on serving. Cancelling what is not running, a stream of what
was not streamed in the background, and continuing a running response
are 400s naming what is wrong; unknown ids 404s. A server stopped with
background responses running exits cleanly. In process, over an engine
link that never finishes a request: the app's shutdown aborts the running
ones' engine requests before the link closes, an engine that stops
leaves them "failed" with OpenAI's ``error``, and a response cancelled
(by the cancel route, DELETE or the shutdown) before its task ever ran
ends as one cancelled mid-way: its engine request aborted, its events'
log closed, its entry "cancelled" (or gone). ``EventLog`` and
``BackgroundRuns`` are checked by hand on an event loop, the store's
bounds pass over running responses, and it counts every event of a
streamed one."""

from __future__ import annotations

import asyncio
import inspect
import json
import time

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseQueuedEvent, ResponseStreamEvent
from pydantic import TypeAdapter
from starlette.testclient import TestClient

from checkpoint.tokenizer import Tokenizer
from engine.prometheus_metrics import Metrics
from serving.http.app import create_app
from serving.http.logprobs import LogprobsFormatter
from serving.http.protocol import ResponsesRequest
from serving.http.response_store import ResponseStore
from serving.http.responses_background import BackgroundRuns, EventLog
from serving.http.serving_responses import cancel_response, create_response, delete_response
from serving.http.state import ServerState
from tests.helpers.engine_links import AcceptingLink, AnsweringLink
from tests.helpers.http_utils import (
    metric,
    openai_client,
    serving_tiny,
    start_http,
    stop_http,
    wait_for_metric,
)

pytestmark = pytest.mark.timeout(180)

RUNNING = "tprun:num_requests_running"
GENERATED = "tprun:generation_tokens_total"
# Long enough to be cancelled mid-way (tiny's context is 4096 tokens).
LONG = dict(model="tiny", input="Tell me a long story.", max_output_tokens=3000,
            extra_body={"ignore_eos": True})
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats",
                      "--enable-responses-api-store") as served:
        yield served


def _finished(client, response_id: str, timeout_s: float = 60):
    """The response once it is no longer queued or in progress (polled)."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = client.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress") or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def _until_in_progress(client, response_id: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while (response := client.responses.retrieve(response_id)).status == "queued" and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    return response


def _typed_events(method: str, url: str, **kwargs) -> list:
    """A response stream's events, each validated as the ``openai``
    package's ``ResponseStreamEvent`` with every required field."""
    events = []
    with httpx.stream(method, url, timeout=60, **kwargs) as stream:
        assert stream.status_code == 200, stream.read()
        for line in stream.iter_lines():
            if line.startswith("data: "):
                events.append(EVENTS.validate_json(line[len("data: "):]))
    return events


def _counts(response) -> tuple:
    usage = response.usage
    return usage.input_tokens, usage.output_tokens, usage.total_tokens


def _text(events) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


@pytest.mark.parametrize("fields", [
    {"max_output_tokens": 16},
    {"max_output_tokens": 5, "extra_body": {"ignore_eos": True}},  # cut: "incomplete"
    {"max_output_tokens": 8, "instructions": "Be brief.", "include":
        ["message.output_text.logprobs"], "top_logprobs": 2},
])
def test_a_polled_background_response_is_the_foreground_answer(server, client, fields):
    ask = dict(model="tiny", input="Name a color.", temperature=0, **fields)
    foreground = client.responses.create(**ask)
    queued = client.responses.create(**ask, background=True)
    assert (queued.status, queued.background, queued.output, queued.usage) == \
        ("queued", True, [], None)
    done = _finished(client, queued.id)
    assert done.id == queued.id and done.background is True and foreground.background is False
    assert done.status == foreground.status and done.status in ("completed", "incomplete")
    assert done.output_text == foreground.output_text
    assert _counts(done) == _counts(foreground)
    assert [e.token for e in done.output[0].content[0].logprobs] == \
        [e.token for e in foreground.output[0].content[0].logprobs]
    raw = httpx.get(f"{server.url}/v1/responses/{queued.id}", timeout=60).json()
    assert Response.model_validate(raw).model_dump() == done.model_dump()
    listed = [[(p.type, p.text) for p in item.content]
              for item in client.responses.input_items.list(done.id)]
    assert listed == [[(p.type, p.text) for p in item.content]
                      for item in client.responses.input_items.list(foreground.id)]


def test_a_streamed_background_response_replays_the_foreground_stream(server, client):
    body = {"model": "tiny", "input": "Tell me a story.", "temperature": 0,
            "max_output_tokens": 24, "stream": True}
    url = f"{server.url}/v1/responses"
    foreground = _typed_events("POST", url, json=body)
    created = _typed_events("POST", url, json={**body, "background": True})
    response_id = created[0].response.id
    kinds = [e.type for e in foreground]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert [e.type for e in created] == [kinds[0], "response.queued", *kinds[1:]]
    assert kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in created] == list(range(len(created)))
    assert _text(created) == _text(foreground) == foreground[-1].response.output_text
    final = created[-1].response
    assert final.background is True and final.output_text == foreground[-1].response.output_text
    assert _counts(final) == _counts(foreground[-1].response)
    assert client.responses.retrieve(response_id).model_dump() == final.model_dump()

    replayed = _typed_events("GET", f"{url}/{response_id}", params={"stream": "true"})
    assert [e.model_dump() for e in replayed] == [e.model_dump() for e in created]
    with client.responses.retrieve(response_id, stream=True) as stream:  # the client's way
        assert [e.model_dump() for e in stream] == [e.model_dump() for e in created]
    with client.responses.retrieve(response_id, stream=True, starting_after=3) as stream:
        after = list(stream)
    assert [e.model_dump() for e in after] == [e.model_dump() for e in created[4:]]
    last = created[-1].sequence_number
    with client.responses.retrieve(response_id, stream=True, starting_after=last) as stream:
        assert list(stream) == []


def test_a_background_stream_goes_from_queued_to_in_progress_as_openais(server, client):
    """Through the client's stream, OpenAI's events for a background
    response: ``response.created`` and ``response.queued`` with the
    response "queued" (as the create call without ``stream`` and polling
    show it), ``response.in_progress`` with it "in_progress", then the
    message's events and the finished response, numbered in order; a
    replay after ``starting_after`` 1 begins at ``response.in_progress``."""
    with client.responses.create(model="tiny", input="Name a color.", temperature=0,
                                 max_output_tokens=8, stream=True, background=True) as stream:
        events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert isinstance(events[1], ResponseQueuedEvent)
    statuses = [(e.type, e.response.status) for e in events if hasattr(e, "response")]
    final = events[-1].response
    assert statuses == [("response.created", "queued"), ("response.queued", "queued"),
                        ("response.in_progress", "in_progress"),
                        (f"response.{final.status}", final.status)]
    assert final.status in ("completed", "incomplete")
    assert [e.type for e in events[3:5]] == ["response.output_item.added",
                                             "response.content_part.added"]
    assert _text(events) == final.output_text
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()
    with client.responses.retrieve(final.id, stream=True, starting_after=1) as replay:
        after = list(replay)
    assert after[0].type == "response.in_progress"
    assert [e.model_dump() for e in after] == [e.model_dump() for e in events[2:]]


def test_cancel_stops_the_engine_request_and_the_server_goes_on(server, client):
    """Cancelled once it runs, the response's engine request ends short of
    its 3000 tokens (the engine's own count of generated tokens)."""
    assert wait_for_metric(server.url, RUNNING, lambda v: v == 0) == 0
    generated = metric(server.url, GENERATED)
    started = client.responses.create(**LONG, background=True)
    assert _until_in_progress(client, started.id).status == "in_progress"
    assert wait_for_metric(server.url, RUNNING, lambda v: v == 1) == 1
    cancelled = client.responses.cancel(started.id)
    assert (cancelled.id, cancelled.status, cancelled.background) == \
        (started.id, "cancelled", True)
    assert wait_for_metric(server.url, RUNNING, lambda v: v == 0) == 0
    assert metric(server.url, "tprun:kv_cache_usage_perc") == 0
    assert 0 < metric(server.url, GENERATED) - generated < LONG["max_output_tokens"]
    assert client.responses.retrieve(started.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError, match="already finished") as raised:
        client.responses.cancel(started.id)  # vLLM's answer to a finished one
    assert "cancelled" in raised.value.message
    assert client.responses.input_items.list(started.id).data[0].content[0].text == \
        LONG["input"]
    again = client.responses.create(model="tiny", input="Hi", temperature=0,
                                    max_output_tokens=4)
    assert again.status in ("completed", "incomplete") and again.usage.output_tokens >= 1


def test_a_client_that_leaves_a_background_stream_does_not_end_it(server, client):
    """Left after its first event, the response runs to its end; its
    events, followed live after ``starting_after`` from another
    connection, go on to that end."""
    body = {"model": "tiny", "input": "Count.", "temperature": 0, "max_output_tokens": 200,
            "ignore_eos": True, "stream": True, "background": True}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as stream:
        first = next(line for line in stream.iter_lines() if line.startswith("data: "))
    response_id = json.loads(first[len("data: "):])["response"]["id"]
    with client.responses.retrieve(response_id, stream=True, starting_after=0) as stream:
        followed = list(stream)
    assert followed[0].sequence_number == 1 and followed[-1].type == "response.incomplete"
    done = _finished(client, response_id)
    assert (done.status, done.usage.output_tokens) == ("incomplete", 200)
    assert _text(followed) == done.output_text == followed[-1].response.output_text
    foreground = client.responses.create(model="tiny", input="Count.", temperature=0,
                                         max_output_tokens=200, extra_body={"ignore_eos": True})
    assert done.output_text == foreground.output_text


def test_a_follower_of_a_cancelled_stream_sees_it_end(server, client):
    """Cancelled mid-way, a streamed background response's followers get
    every event it logged, then the end of the stream (no terminal event:
    OpenAI's stream events have none for "cancelled"); a replay gives
    the same."""
    body = dict(LONG, stream=True, background=True)
    with client.responses.create(**body) as stream:
        events = iter(stream)
        response_id = next(events).response.id
        seen = [next(events) for _ in range(6)]  # up to some text deltas
        assert seen[-1].type == "response.output_text.delta"
        assert client.responses.cancel(response_id).status == "cancelled"
        rest = list(events)
    assert wait_for_metric(server.url, RUNNING, lambda v: v == 0) == 0
    kinds = {e.type for e in rest}
    assert kinds <= {"response.output_text.delta"}
    with client.responses.retrieve(response_id, stream=True, starting_after=6) as replay:
        assert [e.model_dump() for e in replay] == [e.model_dump() for e in rest]
    assert _finished(client, response_id).status == "cancelled"


def test_what_cannot_be_cancelled_or_streamed_is_a_400(server, client):
    foreground = client.responses.create(model="tiny", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="background: true"):
        client.responses.cancel(foreground.id)
    polled = client.responses.create(model="tiny", input="Hi", max_output_tokens=2,
                                     background=True)
    assert _finished(client, polled.id).status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError, match="already finished"):
        client.responses.cancel(polled.id)
    for response_id in (foreground.id, polled.id):  # neither was streamed in the background
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.retrieve(response_id, stream=True)
        assert raised.value.param == "stream" and "background" in raised.value.message
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.cancel("resp_never_made")
    assert "resp_never_made" in raised.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_never_made", stream=True)
    streamed = list(client.responses.create(model="tiny", input="Hi", max_output_tokens=2,
                                            stream=True, background=True))
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.retrieve(streamed[0].response.id, stream=True, starting_after=-2)
    assert raised.value.param == "starting_after"


@pytest.mark.parametrize("fields, message", [
    ({"store": False}, "store"),
    ({"store": False, "stream": True}, "store"),
    ({"store": None}, "store"),  # null is false to vLLM
])
def test_background_without_store_is_a_400_naming_it(client, fields, message):
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input="Hi", max_output_tokens=2,
                                background=True, **fields)
    assert raised.value.param == "background" and message in raised.value.message
    assert "background" in raised.value.message


def test_a_running_response_is_continued_only_once_finished(server, client):
    started = client.responses.create(**LONG, background=True)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input="More", max_output_tokens=2,
                                previous_response_id=started.id)
    assert raised.value.param == "previous_response_id" and "still" in raised.value.message
    client.responses.cancel(started.id)
    short = client.responses.create(model="tiny", input="Hi", temperature=0,
                                    max_output_tokens=4, background=True)
    first = _finished(client, short.id)
    second = client.responses.create(model="tiny", input="Go on.", temperature=0,
                                     max_output_tokens=4, previous_response_id=first.id)
    chat = client.chat.completions.create(
        model="tiny", temperature=0, max_tokens=4,
        messages=[{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": first.output_text},
                  {"role": "user", "content": "Go on."}])
    assert second.output_text == chat.choices[0].message.content


def test_deleting_a_running_response_cancels_it(server, client):
    assert wait_for_metric(server.url, RUNNING, lambda v: v == 0) == 0
    started = client.responses.create(**LONG, background=True)
    assert wait_for_metric(server.url, RUNNING, lambda v: v == 1) == 1
    assert client.responses.delete(started.id) is None
    assert wait_for_metric(server.url, RUNNING, lambda v: v == 0) == 0
    assert metric(server.url, "tprun:kv_cache_usage_perc") == 0
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(started.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel(started.id)


def test_a_server_stopped_with_background_responses_running_exits_cleanly(tmp_path):
    """One polled, one streamed with its follower still connected: the
    server exits with code 0, no process left, nothing failed."""
    served = start_http(tmp_path, "serve", "--model", "tiny", "--device", "cpu",
                        "--disable-log-stats", "--enable-responses-api-store")
    try:
        with openai_client(served) as client:
            client.responses.create(**LONG, background=True)
            with client.responses.create(**LONG, background=True, stream=True) as stream:
                next(iter(stream))
                assert wait_for_metric(served.url, RUNNING, lambda v: v == 2) == 2
                code, output, leftovers = stop_http(served)
    finally:
        if served.proc.poll() is None:
            stop_http(served)
    assert code == 0 and not leftovers, output
    assert "Traceback" not in output and "Task was destroyed" not in output, output


def test_the_apps_shutdown_aborts_running_background_responses_before_its_link_closes(
        tiny_dir):
    """In process, with an engine link that never finishes a request: two
    background responses (one streamed) are running when the app shuts
    down, and their engine requests are aborted before the link closes.
    With no output yet both are "queued", polled and in the stream's
    first events (``response.created``, ``response.queued``)."""
    link = AcceptingLink()
    app = create_app(link, Tokenizer.from_dir(tiny_dir), ["tiny"], 4096,
                     enable_responses_api_store=True)
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 8, "background": True}
    with TestClient(app) as http:
        queued = http.post("/v1/responses", json=body)
        assert queued.status_code == 200 and queued.json()["status"] == "queued"
        with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            opening = [EVENTS.validate_json(next(line for line in lines
                                                 if line.startswith("data: "))[len("data: "):])
                       for _ in range(2)]
        assert len(link.live) == 2
        assert [(e.type, e.response.status) for e in opening] == \
            [("response.created", "queued"), ("response.queued", "queued")]
        for response_id in (queued.json()["id"], opening[0].response.id):
            assert http.get(f"/v1/responses/{response_id}").json()["status"] == "queued"
    assert link.live_at_close == set()


def test_a_background_response_the_engine_stops_ends_failed(tiny_dir):
    """The engine stops after accepting: the polled response ends "failed"
    with OpenAI's ``error`` (the reason's first line), the streamed one's
    events end with the stream's error event, and both are stored so."""
    app = create_app(AcceptingLink(stops=True), Tokenizer.from_dir(tiny_dir), ["tiny"], 4096,
                     enable_responses_api_store=True)
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 8, "background": True}
    with TestClient(app) as http:
        response_id = http.post("/v1/responses", json=body).json()["id"]
        streamed = http.post("/v1/responses", json={**body, "stream": True}).text
        events = [EVENTS.validate_json(line[len("data: "):])
                  for line in streamed.splitlines() if line.startswith("data: ")]
        deadline = time.monotonic() + 30
        while (polled := http.get(f"/v1/responses/{response_id}").json())["status"] in \
                ("queued", "in_progress") and time.monotonic() < deadline:
            time.sleep(0.01)
        stored = http.get(f"/v1/responses/{events[0].response.id}").json()
    for failed in (polled, stored):
        assert Response.model_validate(failed).status == "failed"
        assert failed["error"] == {"code": "server_error",
                                   "message": "the engine stopped: a worker died"}
    assert [e.type for e in events] == ["response.created", "response.queued", "error"]
    assert [e.response.status for e in events[:2]] == ["queued", "queued"]
    assert events[-1].message == "the engine stopped: a worker died"


@pytest.mark.parametrize("started", [False, True])
@pytest.mark.parametrize("canceller", ["cancel", "delete", "shutdown"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_background_response_cancelled_before_or_after_it_ran_ends_whole(
        tiny_dir, canceller, stream, started):
    """In process, over an engine link that never finishes a request: a
    background response cancelled by the cancel route, DELETE or the
    server's shutdown, right after its create call returned (its task not
    yet run) or once its task has run, has its engine request aborted, its
    log closed (a follower's stream ends) and its stored entry final:
    "cancelled", or gone after DELETE."""
    tokenizer = Tokenizer.from_dir(tiny_dir)
    link = AcceptingLink()
    state = ServerState(link, tokenizer, ("tiny",), 4096, Metrics("tiny"),
                        LogprobsFormatter(tokenizer), response_store=ResponseStore())
    request = ResponsesRequest(model="tiny", input="Hi", max_output_tokens=8, background=True,
                               stream=stream)

    async def scenario():
        await create_response(state, request, None)
        ((response_id, task),) = state.background.tasks.items()
        log = state.response_store.get(response_id).events
        follower = asyncio.ensure_future(_gather(log.follow())) if stream else None
        if started:
            await asyncio.sleep(0.01)
        assert inspect.getcoroutinestate(task.get_coro()) == (
            inspect.CORO_SUSPENDED if started else inspect.CORO_CREATED)
        assert len(link.live) == 1
        if canceller == "cancel":
            await cancel_response(state, response_id)
        elif canceller == "delete":
            await delete_response(state, response_id)
        else:
            await state.background.shutdown()
        followed = None if follower is None else await asyncio.wait_for(follower, 5)
        return response_id, log, followed

    response_id, log, followed = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert link.live == set() and state.background.tasks == {}
    entry = state.response_store.get(response_id)
    if canceller == "delete":
        assert entry is None
    else:
        assert entry.body["status"] == "cancelled" and not entry.running
    if stream:
        assert log.closed and followed == log.events
    assert state.response_store.chars == sum(e.chars for e in state.response_store.entries.values())


def test_the_store_counts_every_event_of_a_streamed_background_response(tiny_dir):
    """In process: once a streamed background response has ended, the
    store counts it as its bound says, the JSON text of its body,
    conversation and input items and every logged event, up to the last
    (``response.incomplete``, logged after the finished response was
    stored), and its total is that entry's."""
    tokenizer = Tokenizer.from_dir(tiny_dir)
    link = AnsweringLink([72, 105], "Hi", "length")  # two tokens, cut at max_tokens
    state = ServerState(link, tokenizer, ("tiny",), 4096, Metrics("tiny"),
                        LogprobsFormatter(tokenizer), response_store=ResponseStore())
    request = ResponsesRequest(model="tiny", input="Hi", max_output_tokens=2, background=True,
                               stream=True)

    async def scenario() -> None:
        await create_response(state, request, None)
        await asyncio.wait(list(state.background.tasks.values()))

    asyncio.run(asyncio.wait_for(scenario(), 30))
    (entry,) = state.response_store.entries.values()
    last = json.loads(entry.events.events[-1].split("data: ", 1)[1])
    assert entry.events.closed and last["type"] == "response.incomplete"
    assert last["response"] == entry.body
    parts = (entry.body, entry.conversation, entry.input_items)
    want = sum(len(json.dumps(part)) for part in parts) + sum(map(len, entry.events.events))
    assert entry.chars == state.response_store.chars == want


def test_event_log_followers_get_logged_and_new_events_until_closed():
    async def scenario():
        log = EventLog()
        log.append("e0")
        log.append("e1")
        everything = asyncio.ensure_future(_gather(log.follow()))
        after_0 = asyncio.ensure_future(_gather(log.follow(0)))
        past_the_end = asyncio.ensure_future(_gather(log.follow(5)))
        await asyncio.sleep(0)
        log.append("e2")
        await asyncio.sleep(0)
        log.append("e3")
        log.close()
        late = await _gather(log.follow(1))
        return await everything, await after_0, await past_the_end, late, log.chars()

    assert asyncio.run(asyncio.wait_for(scenario(), 10)) == (
        ["e0", "e1", "e2", "e3"], ["e1", "e2", "e3"], [], ["e2", "e3"], 8)


async def _gather(events) -> list[str]:
    return [event async for event in events]


def test_background_runs_hold_their_tasks_until_done_and_cancel_them():
    """A task is held while it runs and let go when done, its ``ended``
    called however it ended; ``cancel`` returns once the cancelled task's
    ``finally`` and ``ended`` have run; a task cancelled before it began
    never runs its work (``finally`` included), but its ``ended`` is
    called; ``shutdown`` ends every task still running."""
    async def scenario():
        runs, ended, closed = BackgroundRuns(), [], []

        async def work(name: str, forever: bool) -> None:
            try:
                await asyncio.sleep(3600 if forever else 0)
            finally:
                ended.append(name)

        def start(name: str, forever: bool) -> None:
            runs.start(name, work(name, forever),
                       lambda task: closed.append((name, task.cancelled())))

        start("a", forever=True)
        start("b", forever=True)
        start("c", forever=False)
        assert all(runs.running(name) for name in "abc")
        await asyncio.sleep(0.01)
        assert ended == ["c"] and not runs.running("c") and sorted(runs.tasks) == ["a", "b"]
        assert closed == [("c", False)]
        await runs.cancel("a")
        assert ended == ["c", "a"] and list(runs.tasks) == ["b"]
        assert closed == [("c", False), ("a", True)]
        await runs.cancel("a")  # no longer running: nothing to do
        start("d", forever=False)
        await runs.cancel("d")  # before its first step
        assert ended == ["c", "a"] and closed[-1] == ("d", True)
        await runs.shutdown()
        return ended, closed, dict(runs.tasks)

    assert asyncio.run(asyncio.wait_for(scenario(), 10)) == (
        ["c", "a", "b"], [("c", False), ("a", True), ("d", True), ("b", True)], {})


def _entry(name: str, status: str) -> tuple:
    body = {"id": f"resp_{name}", "object": "response", "status": status, "output": []}
    return body, [{"role": "user", "content": "x" * 100}], []


def test_the_stores_bounds_pass_over_running_responses():
    """Under a bound of 2 entries, running responses are never dropped:
    the oldest finished one goes instead, and with none finished the
    bound is exceeded; once finished (stored again, as the newest) a
    response is dropped as any other."""
    store = ResponseStore(max_responses=2)
    store.put(*_entry("a", "queued"))
    store.put(*_entry("b", "completed"))
    store.put(*_entry("c", "in_progress"))
    assert list(store.entries) == ["resp_a", "resp_c"]
    store.put(*_entry("d", "queued"))
    assert list(store.entries) == ["resp_a", "resp_c", "resp_d"]
    store.put(*_entry("a", "completed"))  # finished: the newest, kept
    assert list(store.entries) == ["resp_c", "resp_d", "resp_a"]
    store.put(*_entry("c", "cancelled"))
    assert list(store.entries) == ["resp_d", "resp_c"]
    assert store.chars == sum(entry.chars for entry in store.entries.values())
