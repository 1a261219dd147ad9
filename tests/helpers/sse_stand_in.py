"""A stand-in OpenAI-compatible streaming server for ``tprun bench
serve``'s client: a raw HTTP/1.1 server on 127.0.0.1 (an asyncio loop in
a thread of its own) that answers each POST with exactly the bytes a test
gives, in the pieces it gives, each piece one chunk of a chunked body
written on its own, with a pause after it where the test asks for one.
It records each request (path, headers, JSON body) and counts the TCP
connections it accepted, so a test sees what the client sent and how it
reused connections; with ``barrier`` it answers no request before that
many have arrived. ``hold`` answers nothing at all: it keeps the
connection open, unanswered, until the server stops."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# One answer: pieces of the body, each with the seconds to wait after it.
Answer = list[tuple[bytes, float]]


def event(obj: dict | str) -> bytes:
    """One server-sent event of ``obj`` (JSON, or the raw text given)."""
    return b"data: " + (obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n\n"


def token(text: str) -> dict:
    return {"choices": [{"index": 0, "text": text}]}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                     "completion_tokens": completion_tokens}}


HOLD: Answer = [(b"hold", -1.0)]


@dataclass
class StandIn:
    answer: Callable[[int, dict], Answer]
    status: int = 200
    # Answer no request before this many have arrived.
    barrier: int = 0
    requests: list[dict] = field(default_factory=list)
    connections: int = 0
    url: str = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
                headers = {k.lower(): v for k, v in headers.items()}
                body = json.loads(await reader.readexactly(int(headers["content-length"])))
                self.requests.append({"path": head[0].split()[1], "headers": headers,
                                      "body": body})
                pieces = self.answer(len(self.requests) - 1, body)
                while len(self.requests) < self.barrier:
                    await asyncio.sleep(0.01)
                if pieces == HOLD:
                    await asyncio.Event().wait()
                writer.write(f"HTTP/1.1 {self.status} Status\r\ncontent-type: "
                             "text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".encode())
                for piece, pause in pieces:
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                    if pause:
                        await asyncio.sleep(pause)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


class running:
    """``with running(stand_in) as url:`` serves ``stand_in`` on a free
    port of 127.0.0.1 for the block (over TLS with ``tls``, an
    ``ssl.SSLContext`` of the server: an https URL)."""

    def __init__(self, stand_in: StandIn, tls=None):
        self.stand_in = stand_in
        self.tls = tls
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self.stand_in._serve, "127.0.0.1", 0, ssl=self.tls),
            self.loop).result(10)
        port = self.server.sockets[0].getsockname()[1]
        self.stand_in.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        return self.stand_in.url

    def __exit__(self, *exc) -> None:
        async def stop():
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
