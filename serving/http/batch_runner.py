"""``run_batch``: each line of an OpenAI batch file sent through the HTTP
app in process (``asgi_call``), its output line written in the input's
order (``batch_lines`` gives both formats).

Every request gets the answer the HTTP server gives it: the same app, its
routes and error rule, on an engine started as ``serve`` starts it. A
line whose url the model does not answer (chat on a pooling model,
embeddings, score or rerank on a generating one, classification on one
that does not classify) gets vLLM's error line in place of the server's
404. An answer of bytes, not JSON (an embeddings line's
``encoding_format`` "bytes" or "bytes_only"), gets vLLM's stream-mode
error line, as vLLM's run-batch writes only its JSON answers. Lines run
concurrently, so the engine batches them. Blank lines are skipped (as
vLLM skips them); every other line gets exactly one output line, in its
place, whatever happens to the others.

An engine that stops under the run (a worker failed) ends it: the first
request answered 503 (``errors.error_answer``'s status for a stopped
engine, which every later request would get too) writes no line, reading
stops, the lines running finish (each answered 503, unwritten) and
``run_batch`` raises ``EngineGone``; the output holds only the lines
before it, each the answer it would have had. An output line that cannot
be written (a pipe whose reader left, a full disk) ends the run the same
way, with its error. No line's task ends with an exception: every failure
is the run's, raised once, after the lines running end (a failed line is
never written, so a reader waiting for its slot would wait forever).

Memory stays bounded however long the file: at most ``window`` lines are
read and not yet written (running, or done and waiting for an earlier
line to finish); reading waits while the window is full. An output line
is written, and flushed, as soon as every line before it is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TextIO

from starlette.types import ASGIApp

from serving.http.asgi_call import call
from serving.http.batch_lines import (
    BATCH_URLS,
    GENERATION_URLS,
    STREAM_REFUSED,
    NotABatchRequest,
    answered,
    failed,
    read_line,
    unserved_url,
    unsupported_api,
)
from serving.http.pooling_encoding import BYTES_MEDIA_TYPE

# The status of every request once the engine has stopped.
ENGINE_STOPPED = 503


class EngineGone(RuntimeError):
    """The engine stopped under the run: no later line can be answered."""


@dataclass
class BatchSummary:
    """What a run wrote: output lines, those with status 200, and the
    lines (their numbers in the input, from 1, and why) that were not
    batch requests."""

    written: int = 0
    answered: int = 0
    not_requests: list[tuple[int, str]] = field(default_factory=list)


class OrderedWriter:
    """Output lines written in their input's order: a line done early waits
    until every earlier one is written."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.next = 0
        self.waiting: dict[int, str] = {}

    def add(self, index: int, line: str) -> int:
        """Hand in line ``index`` (from 0); returns how many lines this wrote."""
        self.waiting[index] = line
        start = self.next
        while self.next in self.waiting:
            self.out.write(self.waiting.pop(self.next) + "\n")
            self.next += 1
        if self.next > start:
            self.out.flush()
        return self.next - start


async def run_batch(app: ASGIApp, readline: Callable[[], bytes], out: TextIO, window: int,
                    on_done: Callable[[], None] = lambda: None,
                    model_urls: Collection[str] = GENERATION_URLS) -> BatchSummary:
    """Every line ``readline`` gives (its bytes, until it gives b"") answered
    into ``out``.
    ``readline`` runs in a worker thread (a pipe may block); ``on_done``
    is called as each request is answered (a progress bar's update);
    ``model_urls``: the urls of ``BATCH_URLS`` the model answers
    (``batch_lines.model_urls``), a line naming another of them gets
    vLLM's "does not support" error line without reaching the app."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    summary = BatchSummary()
    writer = OrderedWriter(out)
    room = asyncio.Semaphore(window)
    tasks: set[asyncio.Task] = set()

    stopped: list[Exception] = []  # the failures that end the run, the first raised

    async def run_line(index: int, number: int, text: bytes) -> None:
        try:
            line, ok = await _output_line(app, number, text, summary, model_urls)
            summary.answered += ok
            on_done()
            written = writer.add(index, line)
        except Exception as e:  # EngineGone, or an output that cannot be written
            stopped.append(e)
            room.release()  # wakes the reader, which then stops
            return
        summary.written += written
        for _ in range(written):  # a slot is free once its line is written
            room.release()

    index = number = 0
    try:
        while True:
            await room.acquire()  # before reading: a line read is a line held
            if stopped:
                break
            text = await asyncio.to_thread(readline)
            if not text:
                room.release()
                break
            number += 1
            if not text.strip():  # skipped, as vLLM skips blank lines
                room.release()
                continue
            task = asyncio.create_task(run_line(index, number, text))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # each cancelled task's end read
    if stopped:
        raise stopped[0]
    return summary


async def _output_line(app: ASGIApp, number: int, text: bytes, summary: BatchSummary,
                       model_urls: Collection[str]) -> tuple[str, bool]:
    """The output line of input line ``number``, and whether it is an answer
    (status 200)."""
    try:
        request = read_line(text)
    except NotABatchRequest as e:
        summary.not_requests.append((number, str(e)))
        return failed(e.custom_id, f"line {number} is not a batch request: {e}"), False
    if request.url not in BATCH_URLS:
        return failed(request.custom_id, unserved_url(request.url)), False
    if request.url not in model_urls:
        return failed(request.custom_id, unsupported_api(request.url)), False
    try:
        answer = await call(app, request.method, request.url,
                            json.dumps(request.body).encode())
    except Exception as e:  # the app answers its own failures: this is a broken app
        return failed(request.custom_id, str(e) or type(e).__name__), False
    if answer.streamed or answer.content_type == BYTES_MEDIA_TYPE:
        return failed(request.custom_id, STREAM_REFUSED), False
    if answer.status == ENGINE_STOPPED:
        raise EngineGone(f"the engine stopped at line {number}: {_body(answer.body)}")
    return answered(request.custom_id, answer.status, _body(answer.body)), answer.status == 200


def _body(raw: bytes):
    """An answer's JSON body (its text, should it not be JSON)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
