"""Server-sent events, and what happens when the client goes away.

``EventStream`` is a streaming response tied to a ``Generation``: however
the response ends (finished, client disconnected, task cancelled, or never
started because the client left first), its engine requests are aborted,
so their KV blocks are freed. ``cancel_on_disconnect`` does the same for a
non-streaming request: it runs the collecting coroutine until it finishes
or the client disconnects, whichever comes first. ``followed_stream`` is
the one stream that aborts nothing when it ends: it follows a background
response, which runs on until it finishes or is cancelled.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from serving.http.errors import error_answer
from serving.http.generation import Generation

T = TypeVar("T")

DONE = "data: [DONE]\n\n"


# ``json.dumps(payload, ensure_ascii=False)``'s encoder, made once.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def sse(payload: dict) -> str:
    return f"data: {_ENCODER.encode(payload)}\n\n"


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


def followed_stream(events: AsyncIterator[str]) -> StreamingResponse:
    """Server-sent ``events`` that follow work this request does not own
    (a background response's): a client that leaves stops following, and
    nothing is aborted."""
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


class EventStream(StreamingResponse):
    def __init__(self, events: AsyncIterator[str], generation: Generation) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self.generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.generation.abort_unfinished()


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """``await work``, unless the client disconnects first: then ``work`` is
    cancelled and ``ClientDisconnected`` raised."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        finished = task.done()
        if not finished:
            task.cancel()
        elif not task.cancelled():
            # Its failure is read even when this wait is cancelled as it ends
            # (the answer is not wanted), so asyncio logs no lost exception.
            task.exception()
    if not finished:
        raise ClientDisconnected()
    return task.result()


async def respond(raw: Request, generation, stream: bool,
                  events: Callable[[], AsyncIterator[str]],
                  body: Callable[[], Awaitable[dict]]) -> Response:
    """The answer of a started generation: its server-sent events, or its whole
    JSON body; either way a client that leaves aborts what is still running."""
    if stream:
        return EventStream(events(), generation)
    try:
        return JSONResponse(await cancel_on_disconnect(raw, body()))
    finally:
        generation.abort_unfinished()


async def event_lines(chunks: AsyncIterator[dict], head: dict, generation: Generation,
                      include_usage: bool, continuous_usage: bool = False) -> AsyncIterator[str]:
    """An answer's ``chunks`` as server-sent events, then (when asked) the usage
    chunk, then ``[DONE]``. With ``include_usage`` every chunk carries
    ``"usage": null``, as OpenAI's do, or, with ``continuous_usage`` (vLLM's
    ``continuous_usage_stats``), the usage so far. A failure mid-answer
    ends the stream with an error event, then ``[DONE]``: its body is
    ``errors.error_answer``'s, as a whole answer's would be (an engine that
    stopped: 503's; an ``InvalidRequestError``: the client's; anything else:
    the server's own, logged, its text not sent)."""
    try:
        async for chunk in chunks:
            if include_usage:
                chunk = {**chunk, "usage": generation.usage() if continuous_usage else None}
            yield sse(chunk)
    except Exception as e:
        yield sse(error_answer(e)[1])
        yield DONE
        return
    if include_usage:
        yield sse({**head, "choices": [], "usage": generation.usage()})
    yield DONE
