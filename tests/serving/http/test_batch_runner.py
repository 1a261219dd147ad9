"""``run_batch`` and ``asgi_call`` in process, without an engine: output
lines in the input's order when later lines finish first, the lines read
and not yet written never above the window (while the window's lines do
run together), an output that cannot be written ending the run with its
error, lines that are not Unicode text refused in their place, an app
whose startup fails raising its own error, and a streamed answer left at
once with its engine request aborted, as for a client that left."""

from __future__ import annotations

import asyncio
import gc
import io
import json
from contextlib import asynccontextmanager

import pytest
from fastapi import FastAPI

from checkpoint.tokenizer import Tokenizer
from serving.http.app import create_app
from serving.http.asgi_call import call, running
from serving.http.batch_runner import EngineGone, run_batch
from tests.helpers.engine_links import AcceptingLink


class SlowEcho:
    """An ASGI app that answers each body's ``n`` after ``delay`` seconds,
    counting the calls that run at once."""

    def __init__(self) -> None:
        self.running = self.most_running = 0

    async def __call__(self, scope, receive, send) -> None:
        body = json.loads((await receive())["body"])
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        await asyncio.sleep(body["delay"])
        self.running -= 1
        await send({"type": "http.response.start", "status": body.get("status", 200),
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps({"n": body["n"]}).encode()})


class CountingOutput(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.lines = 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        return super().write(text)


@pytest.mark.timeout(30)
def test_lines_are_written_in_order_within_the_window():
    count, window = 12, 3
    lines = [json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/completions",
                         "body": {"n": n, "delay": 0.01 * (count - n)}}) + "\n"
             for n in range(count)]
    app, out = SlowEcho(), CountingOutput()
    source = iter(lines)
    ahead = []  # lines read but not written, as each line is read

    def readline() -> bytes:
        text = next(source, "")
        if text:
            ahead.append(len(ahead) + 1 - out.lines)
        return text.encode()

    summary = asyncio.run(run_batch(app, readline, out, window))
    written = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [o["custom_id"] for o in written] == [f"c{n}" for n in range(count)]
    assert [o["response"]["body"]["n"] for o in written] == list(range(count))
    assert summary.written == summary.answered == count
    assert max(ahead) <= window
    assert app.most_running == window


@pytest.mark.timeout(30)
def test_an_engine_that_stops_ends_the_run_after_the_lines_before_it():
    """The first 503 (a stopped engine's status) is not written: the run
    ends there, the lines before it written, none after."""
    statuses = [200, 200, 503, 200]
    lines = iter(json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/completions",
                             "body": {"n": n, "delay": 0.01 * n, "status": status}}) + "\n"
                 for n, status in enumerate(statuses))
    out = io.StringIO()
    with pytest.raises(EngineGone, match="the engine stopped at line 3"):
        asyncio.run(run_batch(SlowEcho(), lambda: next(lines, "").encode(), out, window=8))
    assert [json.loads(line)["custom_id"] for line in out.getvalue().splitlines()] == ["c0", "c1"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("window", [2, 8])
def test_every_line_the_stopped_engine_answers_ends_quietly_and_the_run_raises_once(window):
    """Once the engine has stopped every running line is answered 503: the
    run raises the first, and no line's task is left with an exception
    nobody reads (asyncio would log each one), with the reader waiting on a
    full window (2) or not (8)."""
    statuses = [200] + [503] * 6
    lines = iter(json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/completions",
                             "body": {"n": n, "delay": 0.01 * (n % 3), "status": status}})
                 + "\n" for n, status in enumerate(statuses))
    unread: list[dict] = []

    async def run():
        asyncio.get_running_loop().set_exception_handler(lambda loop, c: unread.append(c))
        try:
            await run_batch(SlowEcho(), lambda: next(lines, "").encode(), io.StringIO(), window)
        finally:
            gc.collect()  # an unread task exception is reported as its task is freed
            await asyncio.sleep(0)

    with pytest.raises(EngineGone, match="the engine stopped at line"):
        asyncio.run(run())
    gc.collect()
    assert unread == []


class FullDisk(io.StringIO):
    """An output that takes its first ``room`` writes, then fails as a full disk."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, text: str) -> int:
        if self.room == 0:
            raise OSError(28, "No space left on device")
        self.room -= 1
        return super().write(text)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("window", [2, 8])
def test_an_output_that_cannot_be_written_ends_the_run_with_its_error(window):
    """The line whose write fails is never written, so the lines after it
    cannot be either: the run raises the write's error once the lines
    running end (with the reader waiting on a full window, 2, or not, 8),
    the line written before it kept, no task exception left unread."""
    lines = iter(json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/completions",
                             "body": {"n": n, "delay": 0.01 * (n % 3)}}) + "\n"
                 for n in range(10))
    out = FullDisk(room=1)
    unread: list[dict] = []

    async def run():
        asyncio.get_running_loop().set_exception_handler(lambda loop, c: unread.append(c))
        try:
            await run_batch(SlowEcho(), lambda: next(lines, "").encode(), out, window)
        finally:
            gc.collect()
            await asyncio.sleep(0)

    with pytest.raises(OSError, match="No space left on device"):
        asyncio.run(asyncio.wait_for(run(), 10))
    gc.collect()
    assert [json.loads(line)["custom_id"] for line in out.getvalue().splitlines()] == ["c0"]
    assert unread == []


@pytest.mark.timeout(30)
def test_lines_that_are_not_unicode_text_are_refused_in_their_place():
    """A lone surrogate (escaped, as JSON allows it) in a custom_id or an
    url, or bytes that are not UTF-8, make a line that is not a batch
    request: answered in its place, and the lines after it written to the
    UTF-8 output, which could hold no surrogate."""
    good = {"method": "POST", "url": "/v1/completions", "body": {"n": 7, "delay": 0}}
    lines = iter([
        b'{"custom_id": "\\ud800", "method": "POST", "url": "/v1/completions", "body": {}}\n',
        b'{"custom_id": "url", "method": "POST", "url": "/v1/\\udfff", "body": {}}\n',
        b'{"custom_id": "latin-1 \xe9", "method": "POST", "url": "/v1/completions", "body": {}}\n',
        json.dumps({"custom_id": "ok", **good}).encode() + b"\n"])
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    summary = asyncio.run(run_batch(SlowEcho(), lambda: next(lines, b""), out, window=4))
    written = [json.loads(line) for line in raw.getvalue().decode("utf-8").splitlines()]
    assert [o["custom_id"] for o in written] == [None, None, None, "ok"]  # none parses
    for number, o in enumerate(written[:3], start=1):
        assert o["error"].startswith(f"line {number} is not a batch request: not valid JSON")
        assert o["response"]["status_code"] == 400
    assert written[3]["response"]["body"] == {"n": 7}
    assert [number for number, _ in summary.not_requests] == [1, 2, 3]


@pytest.mark.timeout(30)
def test_a_startup_that_fails_raises_the_apps_own_error():
    """The block does not run; the app's own error goes up (not Starlette's
    report of it, a whole traceback), and no task is left unread."""
    @asynccontextmanager
    async def lifespan(_app):
        raise OSError("the engine link could not start")
        yield

    app = FastAPI(lifespan=lifespan)
    unread: list[dict] = []

    async def start():
        asyncio.get_running_loop().set_exception_handler(lambda loop, c: unread.append(c))
        try:
            async with running(app):
                pytest.fail("the block ran")
        finally:
            gc.collect()
            await asyncio.sleep(0)

    with pytest.raises(OSError, match="^the engine link could not start$"):
        asyncio.run(start())
    gc.collect()
    assert unread == []


@pytest.mark.timeout(30)
def test_a_streamed_answer_is_left_at_once_and_its_request_aborted(tiny_dir):
    link = AcceptingLink()  # accepts, never answers: only a disconnect ends the stream
    app = create_app(link, Tokenizer.from_dir(tiny_dir), ["tiny"], 4096)

    async def streamed():
        async with running(app):
            body = json.dumps({"prompt": "Hi", "max_tokens": 5, "stream": True}).encode()
            return await call(app, "POST", "/v1/completions", body)

    answer = asyncio.run(streamed())
    assert answer.streamed and answer.status == 200 and answer.body == b""
    assert link.live_at_close == set()  # aborted before the link closed
