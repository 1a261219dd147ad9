"""The API-key guard with several keys (any one opens /v1; each compared in
constant time, all of them every time), the body guard's time limit (a body
that stops arriving is a 408, one that arrives in parts in time reaches the
app whole), uvicorn's log level from its start, so its start-up lines
show at info, and bytes uvicorn cannot parse as HTTP answered in OpenAI's
error shape, under httptools and h11 alike (read from a raw socket). In
this process, on 127.0.0.1; no engine."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import serving.http.guards as guards
import serving.http.http_server as http_server
from serving.http.guards import ApiKeyCheck, BodySizeLimit
from serving.http.http_server import HttpServer
from serving.http.protocol_errors import JsonBadRequest


async def _ok(_request):
    return PlainTextResponse("ok")


def _app() -> Starlette:
    return Starlette(routes=[Route("/v1/models", _ok), Route("/v2/rerank", _ok),
                             Route("/rerank", _ok), Route("/health", _ok),
                             *(Route(path, _ok) for path in guards.GUARDED_PATHS)])


def _get(app, path: str, key: str | None = None) -> int:
    async def get() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return (await client.get(path, headers=headers)).status_code

    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return asyncio.run(get())


def test_any_of_the_keys_opens_v1():
    app = ApiKeyCheck(_app(), ["key-one", "key-two"])
    assert _get(app, "/v1/models", "key-one") == 200
    assert _get(app, "/v1/models", "key-two") == 200
    assert _get(app, "/v1/models", "key-three") == 401
    assert _get(app, "/v1/models", "key-one key-two") == 401
    assert _get(app, "/v1/models") == 401
    assert _get(app, "/health") == 200


def test_v2_routes_need_the_key_too():
    # vLLM's rule: /v1 and /v2 paths (/v2/rerank) ask for the key; the
    # unversioned paths (/rerank) do not.
    app = ApiKeyCheck(_app(), ["key-one"])
    assert _get(app, "/v2/rerank") == 401
    assert _get(app, "/v2/rerank", "key-two") == 401
    assert _get(app, "/v2/rerank", "key-one") == 200
    assert _get(app, "/rerank") == 200


@pytest.mark.parametrize("path", ["/invocations", "/start_profile", "/stop_profile", "/sleep",
                                  "/wake_up", "/reset_prefix_cache"])
def test_unversioned_routes_that_generate_or_change_the_engine_need_the_key(path):
    # Unlike vLLM: /invocations runs any chat or completion body, and the
    # profiler's and sleep mode's routes change the engine, so a key that
    # left them open would guard nothing.
    app = ApiKeyCheck(_app(), ["key-one"])
    assert _get(app, path) == 401
    assert _get(app, path, "key-two") == 401
    assert _get(app, path, "key-one") == 200


def test_every_key_is_compared_every_time(monkeypatch):
    """Whichever key matches, or none, every key is compared (with
    ``hmac.compare_digest``): the time says nothing of which came close."""
    calls = []
    real = guards.hmac.compare_digest

    def counted(a, b):
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(guards.hmac, "compare_digest", counted)
    check = ApiKeyCheck(_app(), ["a", "b", "c"])
    for given, accepted in ((b"Bearer a", True), (b"Bearer c", True), (b"Bearer x", False)):
        calls.clear()
        assert check.accepts(given) is accepted
        assert calls == [b"Bearer a", b"Bearer b", b"Bearer c"]


@pytest.mark.parametrize("keys", [[], [""], "a-string"])
def test_keys_must_be_a_list_of_non_empty_keys(keys):
    with pytest.raises(ValueError, match="api_keys must be a non-empty list"):
        ApiKeyCheck(_app(), keys)


class _Seen(logging.Filter):
    """The messages uvicorn's error logger lets through (its level decides;
    the filter survives uvicorn's logging set-up, a handler would not)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.messages.append(record.getMessage())
        return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("level, shown", [("info", True), ("debug", True), ("warning", False)])
def test_uvicorn_start_up_lines_follow_the_level(level, shown):
    seen = _Seen()
    logger = logging.getLogger("uvicorn.error")
    logger.addFilter(seen)
    server = HttpServer(_app(), "127.0.0.1", 0, log_level=level)
    try:
        server.start()
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    finally:
        assert server.stop()
        logger.removeFilter(seen)
    started = [m for m in seen.messages
               if "Application startup complete" in m or "Uvicorn running on" in m]
    assert (len(started) == 2) is shown, seen.messages
    assert not shown or logger.getEffectiveLevel() <= logging.INFO


def _through_body_guard(parts: list[bytes], gap_s: float,
                        complete: bool) -> tuple[list[dict], bytes | None]:
    """What the guard (limit 0.2 s a part) sends, and the body its app saw,
    for a body sent in ``parts`` with ``gap_s`` before each; ``complete``
    False: the last part says more follows, and nothing does (as a client
    that declared a length it never sends)."""
    sent, seen = [], []
    last = len(parts) - 1

    async def app(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append(body)

    async def receive():
        if not parts:
            await asyncio.sleep(3600)
        await asyncio.sleep(gap_s)
        index = last - len(parts) + 1
        return {"type": "http.request", "body": parts.pop(0),
                "more_body": index < last or not complete}

    async def send(message):
        sent.append(message)

    guard = BodySizeLimit(app, 1 << 20, body_timeout_s=0.2)
    asyncio.run(guard({"type": "http", "headers": []}, receive, send))
    return sent, seen[0] if seen else None


def test_a_body_that_stops_arriving_is_a_408():
    sent, seen = _through_body_guard([b"{"], gap_s=0.0, complete=False)
    assert seen is None and sent[0]["status"] == 408
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "request_timeout" and "within 0.2 s" in error["message"]


def test_a_body_in_timely_parts_reaches_the_app_whole():
    sent, seen = _through_body_guard([b'{"a": ', b"1", b"}"], gap_s=0.05, complete=True)
    assert sent == [] and seen == b'{"a": 1}'


def _raw_exchange(server: HttpServer, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the answer to ``request`` sent as it is;
    the server must close the connection after it (a read past 10 s fails)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


def _h11_json_errors():
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class H11JsonErrors(JsonBadRequest, H11Protocol):
        pass

    return H11JsonErrors


@pytest.mark.timeout(60)
@pytest.mark.parametrize("parser", ["auto", "h11"])
@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHo st: x\r\n\r\n",
])
def test_bytes_that_are_no_http_get_openais_error_shape(monkeypatch, parser, request_bytes):
    """uvicorn's own 400 for what it cannot parse, in the shape of every
    other error: JSON ``invalid_request_error`` with uvicorn's message, the
    connection closed; a well-formed request on the same server is served."""
    if parser == "h11":
        monkeypatch.setattr(http_server, "JsonErrorsProtocol", _h11_json_errors())
    server = HttpServer(_app(), "127.0.0.1", 0)
    try:
        server.start()
        status, headers, body = _raw_exchange(server, request_bytes)
        assert status == 400 and headers["content-type"] == "application/json"
        assert headers["connection"] == "close" and int(headers["content-length"]) == len(body)
        assert json.loads(body) == {"error": {"message": "Invalid HTTP request received.",
                                              "type": "invalid_request_error", "param": None,
                                              "code": None}}
        status, _, body = _raw_exchange(
            server, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (status, body) == (200, b"ok")
    finally:
        assert server.stop()
