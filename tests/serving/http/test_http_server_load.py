"""``tprun serve --enable-server-load-tracking``: ``GET /load`` answers the
requests in flight of the routes that use the engine, as vLLM's. While
the official ``openai`` client streams completions, another client reads
1, then 2; once the streams end (one read to its end, one closed by its
client mid-way) it reads 0 again; a finished whole answer, a refused
request and routes that do not use the engine leave it at 0. Without the
option ``/load`` answers 0, as vLLM's does."""

from __future__ import annotations

import time

import httpx
import pytest

from serving.http.server_load import LoadTracking, ServerLoad
from tests.helpers.http_utils import openai_client, recording_app, serving_tiny

# Long enough that each stream is still being generated when /load is read.
STREAM = dict(model="tiny", prompt="Count: one two", max_tokens=2000, temperature=0.0,
              stream=True, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("load"), "--nproc-per-node", "1", "serve",
                      "--model", "tiny", "--device", "cpu", "--disable-log-stats",
                      "--enable-server-load-tracking") as served:
        yield served


def _load(url: str) -> int:
    answer = httpx.get(f"{url}/load", timeout=30)
    assert answer.status_code == 200
    body = answer.json()
    assert set(body) == {"server_load"}
    return body["server_load"]


def _settled_load(url: str, want: int, timeout_s: float = 30) -> int:
    """``/load`` once it reads ``want``, or what it reads when ``timeout_s``
    has passed: a response's last bytes reach the client a moment before
    the server's call returns and its count comes down."""
    deadline = time.monotonic() + timeout_s
    while (load := _load(url)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return load


@pytest.mark.timeout(240)
def test_streams_in_flight_are_counted_until_they_end(server):
    assert _load(server.url) == 0
    with openai_client(server) as client:
        first = client.completions.create(**STREAM)
        next(iter(first))  # the stream has started: its request is in flight
        assert _load(server.url) == 1
        second = client.completions.create(**STREAM)
        next(iter(second))
        assert _load(server.url) == 2
        second.close()  # the client leaves mid-stream
        assert _settled_load(server.url, 1) == 1
        chunks = list(first)
        assert chunks[-1].choices[0].finish_reason == "length"
        assert _settled_load(server.url, 0) == 0


@pytest.mark.timeout(240)
def test_whole_answers_and_refusals_leave_no_load(server):
    with openai_client(server) as client:
        answer = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert answer.choices[0].finish_reason is not None
    refused = httpx.post(f"{server.url}/v1/completions",
                         json={"model": "tiny", "prompt": "x", "max_tokens": -1}, timeout=30)
    assert refused.status_code == 400
    assert httpx.get(f"{server.url}/v1/models", timeout=30).status_code == 200
    assert _settled_load(server.url, 0) == 0


def test_off_answers_zero(tiny_dir):
    with recording_app(tiny_dir) as app:
        assert app.http.get("/load").json() == {"server_load": 0}
        app.client.completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert app.http.get("/load").json() == {"server_load": 0}


def test_tracked_routes_by_method():
    """The routes counted: vLLM's, by method; those the server does not
    serve are not counted."""
    served = ["/v1/completions", "/v1/responses", "/invocations"]
    tracking = LoadTracking(None, ServerLoad(True), served)
    assert tracking.tracks("POST", "/v1/completions")
    assert tracking.tracks("POST", "/invocations")
    assert tracking.tracks("GET", "/v1/responses/resp_1")
    assert tracking.tracks("POST", "/v1/responses/resp_1/cancel")
    assert not tracking.tracks("GET", "/v1/completions")
    assert not tracking.tracks("DELETE", "/v1/responses/resp_1")
    assert not tracking.tracks("GET", "/v1/responses/resp_1/input_items")
    assert not tracking.tracks("POST", "/v1/embeddings")  # not served here
    assert not tracking.tracks("GET", "/load")
