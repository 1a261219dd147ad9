"""vLLM's server load tracking (``--enable-server-load-tracking``): how many
requests of the routes that use the engine are in flight, which ``GET
/load`` answers as ``{"server_load": n}``.

A request counts from when it reaches the app (past the API-key check and
the body guards) until its response has been sent whole: a stream's last
event included, or until the client went away or the route failed, so the
count always comes back down. The routes counted are vLLM's
(``TRACKED_ROUTES``, ``TRACKED_PATTERNS``: the generation, Responses API
and pooling routes, and ``/invocations``, which runs one of them), those
this server serves. With tracking off nothing is counted and ``/load``
answers 0, as vLLM's does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

SERVER_LOAD_ROUTE = "/load"
# POST routes counted, by exact path.
TRACKED_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/invocations",
)
# Responses API routes of one response: its retrieval and its cancel.
TRACKED_PATTERNS = (
    (re.compile(r"/v1/responses/[^/]+"), "GET"),
    (re.compile(r"/v1/responses/[^/]+/cancel"), "POST"),
)


class ServerLoad:
    """The count ``/load`` reads; ``enabled``: whether requests are counted."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.in_flight = 0

    def answer(self) -> dict:
        return {"server_load": self.in_flight}


class LoadTracking:
    """ASGI wrapper of ``app`` that counts each HTTP request to a tracked
    route of ``routes`` (the tracked ones this server serves) in ``load``
    while ``app`` answers it."""

    def __init__(self, app: ASGIApp, load: ServerLoad, routes: Iterable[str]) -> None:
        self.app = app
        self.load = load
        self.routes = frozenset(routes)

    def tracks(self, method: str, path: str) -> bool:
        if path in self.routes:
            return method == "POST"
        return "/v1/responses" in self.routes and any(
            pattern.fullmatch(path) and method == wanted for pattern, wanted in TRACKED_PATTERNS
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tracks(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        self.load.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.load.in_flight -= 1
