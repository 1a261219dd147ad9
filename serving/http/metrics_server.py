"""``run-batch --enable-metrics``: the batch app's own ``GET /metrics``
(``app.py``, the page ``serve --http-port`` serves) over HTTP for the
length of the run, as vLLM's run-batch serves its Prometheus page.

The page is the batch app's: its client-side histograms (TTFT, ITL,
end-to-end latency, finished requests) count the batch's requests, and its
engine values are the engine's snapshot at scrape time. Only that route
is reachable (``MetricsOnly``): every other path is a 404 in OpenAI's
error shape, so the port exposes no generation route. Uvicorn runs on the
batch's own event loop, where the app lives, on a socket bound before it
starts (a port taken since the check before the model loaded is an
``OSError`` here, not uvicorn's exit), with the lifespan off: the batch
runs the app's lifespan itself, around this server.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.http.protocol import error_body

METRICS_PATH = "/metrics"


class MetricsOnly:
    """``app`` for ``GET /metrics``; a 404 for any other HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == METRICS_PATH:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            answer = JSONResponse(error_body(f"this server serves GET {METRICS_PATH} only"),
                                  status_code=404)
            await answer(scope, receive, send)


def _bound_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (its first address)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


@asynccontextmanager
async def serving_metrics(app: ASGIApp, host: str, port: int) -> AsyncIterator[int]:
    """``app``'s ``/metrics`` served on ``host:port`` for the block (the
    app's lifespan already running); the bound port (the real one when 0
    was asked for). Started before the block, stopped after it."""
    sock = _bound_socket(host, port)
    config = uvicorn.Config(MetricsOnly(app), lifespan="off", log_level="warning",
                            access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if task.done():
            task.result()  # uvicorn's own error
            raise OSError(f"the metrics server on {host}:{port} did not start")
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        sock.close()
