"""The HTTP app driven in process, as uvicorn drives it, without a socket.

``running(app)`` runs the app's lifespan (its startup on entering, its
shutdown on leaving: the engine link's start and close); ``call(app,
method, path, body)`` sends one JSON request through the whole app, its
middlewares and fast lane included, and returns what a client would
receive. So an answer is the HTTP server's, byte for byte, for the same
request.

The connection of a call stays open until its answer's last part is sent;
then it reads as closed (``http.disconnect``). A streamed answer
(``text/event-stream``) is not read: its connection closes as soon as its
head is sent, so its engine requests are aborted as for a client that
left, and the call returns the head with an empty body and ``streamed``
set.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.types import ASGIApp, Message

# uvicorn's ASGI versions (spec 2.3: a stream learns of a disconnect by reading it).
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_CLIENT = ("127.0.0.1", 0)
_SERVER = ("127.0.0.1", 80)


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes
    streamed: bool


class LifespanFailed(RuntimeError):
    """The app's startup failed without an error of its own (its message
    is the app's)."""


@asynccontextmanager
async def running(app: ASGIApp) -> AsyncIterator[None]:
    """The app started (``lifespan.startup``) for the block, shut down after.
    A startup that fails raises the app's own error (Starlette reports it
    and then raises it: its report's message is the whole traceback)."""
    to_app: asyncio.Queue[Message] = asyncio.Queue()
    from_app: asyncio.Queue[Message] = asyncio.Queue()
    task = asyncio.ensure_future(app({"type": "lifespan", "asgi": _ASGI, "state": {}},
                                     to_app.get, from_app.put))
    await to_app.put({"type": "lifespan.startup"})
    reply = await _reply(task, from_app)
    if reply["type"] != "lifespan.startup.complete":
        await task  # the app's error, when it raises one
        raise LifespanFailed(reply.get("message") or "the app did not start")
    try:
        yield
    finally:
        await to_app.put({"type": "lifespan.shutdown"})
        await _reply(task, from_app)
        await task


async def _reply(task: asyncio.Future, from_app: asyncio.Queue) -> Message:
    """The app's next lifespan message; the app's own error if it ends first."""
    get = asyncio.ensure_future(from_app.get())
    await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
    if get.done():
        return get.result()
    get.cancel()
    task.result()  # raises the app's error
    raise LifespanFailed("the app ended its lifespan without a reply")


async def call(app: ASGIApp, method: str, path: str, body: bytes) -> Answer:
    """``method path`` with the JSON ``body``, through ``app``."""
    closed = asyncio.Event()
    sent_body = False
    head: dict = {}
    parts: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await closed.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            head.update(status=message["status"], content_type=_content_type(message))
            if head["content_type"].startswith("text/event-stream"):
                head["streamed"] = True
                closed.set()
        elif message["type"] == "http.response.body" and not head.get("streamed"):
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                closed.set()

    scope = {"type": "http", "asgi": _ASGI, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "client": _CLIENT, "server": _SERVER, "state": {},
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    try:
        await app(scope, receive, send)
    finally:
        closed.set()
    return Answer(head.get("status", 500), head.get("content_type", ""), b"".join(parts),
                  head.get("streamed", False))


def _content_type(start: Message) -> str:
    for name, value in start.get("headers", ()):
        if name.lower() == b"content-type":
            return value.decode("latin-1")
    return ""
