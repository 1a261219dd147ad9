"""What a request must pass before a route sees it, as plain ASGI
middlewares (they never wrap a streaming response).

``ApiKeyCheck``: with keys set, every path under ``/v1`` or ``/v2``
(``GUARDED_PREFIXES``, vLLM's: /v2/rerank) needs ``Authorization: Bearer
KEY`` with one of them (each compared in constant time, all of them every
time), else 401. Unversioned paths (/score, /rerank, /tokenize) are open,
as in vLLM, except those that generate text or change the engine's state
(``GUARDED_PATHS``: /invocations, which runs any chat or completion body;
the profiler's and sleep mode's routes), which vLLM leaves open: a key
that any client could walk around through them would guard nothing.

``JsonContentType``: a ``POST`` to a route that takes a JSON body, sent
with a ``Content-Type`` that is not JSON (``text/plain``, a form), is
refused with 415 before its body is read, as vLLM's server refuses it. A
body sent without a ``Content-Type`` is read as JSON (FastAPI's rule), and
JSON that does not parse stays the route's 400.

``BodySizeLimit`` refuses request bodies above a size limit (413). A
declared ``Content-Length`` above the limit is refused before the body is
read; a body without one (chunked) is read up to the limit and refused as
soon as it passes it. A body whose next part does not arrive within
``body_timeout_s`` (a client that declared more than it sends, or sends it
a byte at a time) is refused with 408, so it cannot hold its connection and
its task forever. The body that fits is handed to the app unchanged;
after it, the app's ``receive`` reaches the client's connection again (so a
disconnect is still seen).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.http.protocol import error_body

# Seconds a request body's next part may take to arrive.
BODY_TIMEOUT_S = 30.0


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int,
                 body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await self._refuse(send)
            return
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except asyncio.TimeoutError:
                body = json.dumps(error_body(
                    f"the request body did not arrive within {self.body_timeout_s:g} s",
                    code="request_timeout")).encode()
                await send_error(send, 408, body)
                return
            if message["type"] != "http.request":
                chunks.append(message)  # a disconnect: let the app see it
                break
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                await self._refuse(send)
                return
            chunks.append(message)
            if not message.get("more_body", False):
                break
        await self.app(scope, self._replay(chunks, receive), send)

    @staticmethod
    def _replay(chunks: list[Message], receive: Receive) -> Receive:
        async def replayed() -> Message:
            return chunks.pop(0) if chunks else await receive()

        return replayed

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(error_body(
            f"the request body is larger than {self.max_body_bytes} bytes",
            code="request_too_large")).encode()
        await send_error(send, 413, body)


async def send_error(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def is_json_media_type(content_type: bytes) -> bool:
    """Whether FastAPI reads a body of this ``Content-Type`` as JSON:
    ``application/json`` or ``application/*+json``, parameters and case
    aside."""
    media_type = content_type.split(b";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition(b"/")
    return kind == b"application" and (subtype == b"json" or subtype.endswith(b"+json"))


def content_type_of(scope: Scope) -> bytes | None:
    """The request's first ``Content-Type`` header (the one FastAPI reads),
    or None."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-type":
            return value
    return None


class JsonContentType:
    def __init__(self, app: ASGIApp, paths: frozenset[str]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"] in self.paths):
            content_type = content_type_of(scope)
            if content_type is not None and not is_json_media_type(content_type):
                shown = content_type.decode("latin-1")
                body = json.dumps(error_body(
                    f"unsupported media type {shown!r}: the body must be JSON, sent with "
                    "'Content-Type: application/json'",
                    code="unsupported_media_type")).encode()
                await send_error(send, 415, body)
                return
        await self.app(scope, receive, send)


# The path prefixes an API key guards (vLLM's versioned API paths).
GUARDED_PREFIXES = ("/v1", "/v2")
# The unversioned paths it guards too: they generate, or change the engine.
GUARDED_PATHS = frozenset({"/invocations", "/start_profile", "/stop_profile", "/sleep",
                           "/wake_up", "/reset_prefix_cache"})


class ApiKeyCheck:
    def __init__(self, app: ASGIApp, api_keys: Sequence[str]) -> None:
        if isinstance(api_keys, str) or not api_keys or not all(api_keys):
            raise ValueError(f"api_keys must be a non-empty list of keys, got {api_keys!r}")
        self.app = app
        self.expected = [f"Bearer {key}".encode() for key in api_keys]

    def accepts(self, given: bytes) -> bool:
        """Whether ``given`` is one of the expected headers; every one is
        compared, so the time says nothing of which came close."""
        matches = [hmac.compare_digest(given, expected) for expected in self.expected]
        return any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path.startswith(GUARDED_PREFIXES)
                                        or path in GUARDED_PATHS):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not self.accepts(given):
                body = json.dumps(error_body(
                    "a valid API key is needed: send the header 'Authorization: Bearer KEY'",
                    code="invalid_api_key")).encode()
                await send_error(send, 401, body)
                return
        await self.app(scope, receive, send)
