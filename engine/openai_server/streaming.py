"""Server-sent events, and what happens when the client goes away.

``EventStream`` is a streaming response tied to a ``Generation``: however
the response ends (finished, client disconnected, task cancelled, or never
started because the client left first), its engine requests are aborted,
so their KV blocks are freed. ``cancel_on_disconnect`` does the same for a
non-streaming request: it runs the collecting coroutine until it finishes
or the client disconnects, whichever comes first.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.openai_server.generation import Generation

T = TypeVar("T")

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


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
    if not finished:
        raise ClientDisconnected()
    return task.result()
