"""HTTP servers for tests. ``tprun serve --http-port 0``: its URL, read
from the ready line; the server runs in its own session with its output in
a file (as in ``tests.helpers.serve_utils``), and ``stop_http`` leaves no
process of it behind. ``recording_app``: the HTTP app in process, over an
engine link that answers at once and records each prompt.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import NamedTuple

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from checkpoint.tiny_model import TINY_NAME
from checkpoint.tokenizer import Tokenizer
from serving.http.app import create_app
from tests.helpers.engine_links import RecordingLink
from tests.helpers.proc_utils import ROOT, pythonpath
from tests.helpers.serve_utils import Served, _term_with_parent, stop_server
from tests.helpers.think_model import tiny_with_think_tokens
from tests.helpers.tool_template import tiny_with_tool_template

_READY = re.compile(r"HTTP server ready on (http://\S+)")


@dataclass
class HttpServed:
    served: Served
    url: str

    @property
    def proc(self) -> subprocess.Popen:
        return self.served.proc

    def output(self) -> str:
        return self.served.output()


def start_http(tmp_path, *args: str, env: dict | None = None,
               timeout_s: float = 120) -> HttpServed:
    """Start ``python -m launch ARGS serve ... --http-port 0`` (ARGS holds the
    subcommand); wait for its ready line."""
    log_path = str(tmp_path / "serve.log")
    full_env = dict(os.environ, PYTHONPATH=pythonpath(), TPRUN_CACHE=str(tmp_path / "cache"),
                    **(env or {}))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch", *args, "--http-port", "0"], cwd=ROOT,
            env=full_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_term_with_parent)
    served = Served(proc, "", "", log_path)
    deadline = time.monotonic() + timeout_s
    while (match := _READY.search(served.output())) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(served)
            pytest.fail(f"tprun serve --http-port did not start:\n{served.output()}")
        time.sleep(0.1)
    return HttpServed(served, match.group(1))


def serving_tiny(tmp_path, *args: str, env: dict | None = None):
    """``start_http`` (ARGS as there) of a server of ``tiny``, its model
    directory in ``model_dir``; stopped on exit, which must be clean (code 0,
    no process left)."""
    return serving_model(tmp_path, str(tmp_path / "cache" / TINY_NAME), *args, env=env)


def serving_tiny_with_tools(tmp_path, *args: str, special_tokens: dict[str, int] | None = None):
    """``serving_tiny`` of a copy of ``tiny`` whose chat template renders
    tools (``tests.helpers.tool_template``), with ``special_tokens`` added
    to its tokenizer and ``args`` after ``serve --model COPY --device cpu
    --disable-log-stats``; its directory in ``model_dir``."""
    model = tiny_with_tool_template(str(tmp_path / "cache"), str(tmp_path / "tiny-tools"),
                                    special_tokens)
    return _serving_copy(tmp_path, model, *args)


def serving_think_model(tmp_path, *args: str):
    """``serving_tiny`` of ``tiny`` with ``<think>``/``</think>``
    (``tests.helpers.think_model``), ``args`` after ``serve --model COPY
    --device cpu --disable-log-stats``; its directory in ``model_dir``."""
    model = tiny_with_think_tokens(str(tmp_path / "cache"), str(tmp_path / "model"))
    return _serving_copy(tmp_path, model, *args)


def _serving_copy(tmp_path, model: str, *args: str):
    """``serving_model`` of the model directory ``model`` (a copy of ``tiny``),
    ``args`` after ``serve --model MODEL --device cpu --disable-log-stats``."""
    return serving_model(tmp_path, model, "serve", "--model", model, "--device", "cpu",
                    "--disable-log-stats", *args)


@contextlib.contextmanager
def serving_model(tmp_path, model_dir: str, *args: str, env: dict | None = None):
    """``start_http`` (ARGS as there) of a server of the model in
    ``model_dir``, that directory in its ``model_dir``; stopped on exit,
    which must be clean (code 0, no process left)."""
    served = start_http(tmp_path, *args, env=env)
    served.model_dir = model_dir
    yield served
    code, output, leftovers = stop_http(served)
    assert code == 0 and not leftovers, output


def serving_pooling_model(tmp_path, model_dir: str, *args: str):
    """``serving_model`` of a one-process ``serve`` of the model in
    ``model_dir`` on the cpu, its batches and blocks 16 tokens (so a longer
    input is pooled over several steps), ``args`` added (``--runner
    pooling`` for a model that would generate)."""
    return serving_model(tmp_path, model_dir, "--nproc-per-node", "1", "serve",
                         "--model", model_dir, "--device", "cpu",
                         "--max-num-batched-tokens", "16", "--block-size", "16",
                         "--disable-log-stats", *args)


@contextlib.contextmanager
def openai_client(served: HttpServed, api_key: str = "none"):
    """The official client on ``served``'s /v1, without retries."""
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key=api_key, max_retries=0,
                       timeout=60) as client:
        yield client


class RecordingApp(NamedTuple):
    """``recording_app``'s app: the link that records each prompt, the
    app's test client and the official ``openai`` client on it."""

    link: RecordingLink
    http: TestClient
    client: openai.OpenAI


@contextlib.contextmanager
def recording_app(model_dir: str, max_model_len: int = 4096, **app_kwargs):
    """The HTTP app (``create_app`` with ``app_kwargs``) of the model in
    ``model_dir``, served as ``tiny`` in process over a ``RecordingLink``
    (``tests.helpers.engine_links``: only the prompt is under test); the
    app's lifespan (the link's start and close) spans the ``with`` block.
    The ``openai`` client makes no retries, so each call reaches the app
    once."""
    link = RecordingLink()
    app = create_app(link, Tokenizer.from_dir(model_dir), ["tiny"], max_model_len, **app_kwargs)
    with TestClient(app) as http:
        yield RecordingApp(link, http, openai.OpenAI(base_url="http://testserver/v1",
                                                     api_key="none", http_client=http,
                                                     max_retries=0))


def stop_http(server: HttpServed) -> tuple[int, str, list[int]]:
    """SIGTERM; returns (exit code, output, leftover pids)."""
    return stop_server(server.served)


def streamed_chat_deltas(url: str, body: dict) -> list[dict]:
    """Every choice's ``delta`` of a streamed /v1/chat/completions answer
    to ``body`` at server ``url``, in the order the events came."""
    deltas = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                deltas += [c["delta"] for c in json.loads(line[6:])["choices"]]
    return deltas


def typed_responses(url: str, body: dict) -> tuple:
    """``body`` sent to /v1/responses at server ``url`` whole and streamed:
    the answer validated as the ``openai`` package's ``Response`` and each
    streamed event as its ``ResponseStreamEvent``, with every required
    field (its client reads them leniently)."""
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    answer = httpx.post(f"{url}/v1/responses", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    whole = Response.model_validate(answer.json())
    adapter, events = TypeAdapter(ResponseStreamEvent), []
    with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True},
                      timeout=60) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                events.append(adapter.validate_json(line[len("data: "):]))
    return whole, events


def metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """One sample's value from ``GET /metrics``, summed over the samples
    whose labels include ``labels`` (all, without them)."""
    page = httpx.get(f"{url}/metrics", timeout=30).text
    total, seen = 0.0, False
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name and (labels or {}).items() <= sample.labels.items():
                total, seen = total + sample.value, True
    if not seen:
        raise KeyError(f"no sample {name} in /metrics:\n{page}")
    return total


def wait_for_metric(url: str, name: str, predicate, timeout_s: float = 30) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        value = metric(url, name)
        if predicate(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)
