"""One streamed request of a serving benchmark and what it measured, for
the OpenAI completions and chat completions endpoints (vLLM's ``openai`` /
``vllm`` and ``openai-chat`` backends).

Timings are ``time.perf_counter`` seconds taken by the client:
``start_time`` just before the request is sent; each server-sent event
that carries a choice is one "token chunk" (it may hold more than one
token, or an empty text), timed as the read that completes it is
handled (several events in one read get one timestamp each, in order);
``ttft`` is the send to the first chunk,
``itl`` the gaps between consecutive chunks (one per chunk after the
first), ``latency`` (E2EL) the send to the last chunk, so
``ttft <= latency`` and ``ttft + sum(itl) == latency``. The usage event
at the end (``stream_options.include_usage``) carries no choice: it gives
``output_tokens`` and the server's ``prompt_len`` and moves no timing.

A request fails, it never raises: an HTTP status other than 200, a
connection error, the session's timeout or a stream without a token
chunk give ``success`` False and the reason in ``error``.

The transport is aiohttp, vLLM's benchmark client: its connection pool
and C parser keep the client's own work per request small at any
concurrency (a benchmark measures the server; a client whose pool work
grows with the connections open would add its own delay to every TTFT).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from launch.bench_serve.sse import DataLines

# vLLM's backend names: the completions API for "openai" and "vllm".
CHAT_BACKENDS = ("openai-chat",)
COMPLETION_BACKENDS = ("openai", "vllm")
BACKENDS = COMPLETION_BACKENDS + CHAT_BACKENDS


@dataclass
class RequestInput:
    prompt: str
    api_url: str
    prompt_len: int
    output_len: int
    model: str
    logprobs: int | None = None
    ignore_eos: bool = False
    extra_body: dict | None = None
    extra_headers: dict | None = None
    request_id: str | None = None


@dataclass
class RequestOutput:
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    error: str = ""
    start_time: float = 0.0
    # Seconds the request waited for a --max-concurrency place before its send.
    client_queue_time: float = 0.0


def request_body(backend: str, given: RequestInput) -> dict[str, Any]:
    """The JSON body vLLM's benchmark sends for ``backend``: streamed, with
    usage at the end; the extra body (sampling options) last, over all."""
    if backend in CHAT_BACKENDS:
        body = {"model": given.model,
                "messages": [{"role": "user", "content": [{"type": "text",
                                                           "text": given.prompt}]}],
                "max_completion_tokens": given.output_len}
    else:
        body = {"model": given.model, "prompt": given.prompt, "repetition_penalty": 1.0,
                "max_tokens": given.output_len, "logprobs": given.logprobs}
    body.update(stream=True, stream_options={"include_usage": True})
    if given.ignore_eos:
        body["ignore_eos"] = True
    body.update(given.extra_body or {})
    return body


def _chunk_text(backend: str, choice: dict) -> str:
    if backend in CHAT_BACKENDS:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def request_headers(given: RequestInput, api_key: str | None) -> dict[str, str]:
    """``Authorization`` from the API key ($OPENAI_API_KEY, as vLLM's),
    then the user's ``--header`` values, then the request id."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    headers.update(given.extra_headers or {})
    if given.request_id:
        headers["x-request-id"] = given.request_id
    return headers


async def send_request(session: aiohttp.ClientSession, backend: str, given: RequestInput,
                       api_key: str | None = None) -> RequestOutput:
    """Send ``given`` streamed and time its chunks (module docstring)."""
    out = RequestOutput(prompt_len=given.prompt_len)
    body, headers = request_body(backend, given), request_headers(given, api_key)
    text: list[str] = []
    out.start_time = last = time.perf_counter()
    chunks = 0
    try:
        async with session.post(given.api_url, json=body, headers=headers) as response:
            if response.status != 200:
                detail = (await response.read()).decode("utf-8", "replace").strip()
                out.error = f"HTTP {response.status} {response.reason}: {detail}"
                return out
            async for data in _stream_data(response):
                if (data := data.strip()) == "[DONE]":
                    continue
                now, event = time.perf_counter(), json.loads(data)
                if choices := event.get("choices"):
                    if chunks == 0:
                        out.ttft = now - out.start_time
                    else:
                        out.itl.append(now - last)
                    chunks, last = chunks + 1, now
                    text.append(_chunk_text(backend, choices[0]))
                elif usage := event.get("usage"):
                    out.output_tokens = usage.get("completion_tokens") or 0
                    if usage.get("prompt_tokens") is not None:
                        out.prompt_len = usage["prompt_tokens"]
        out.generated_text = "".join(text)
        out.latency = last - out.start_time
        out.success = chunks > 0
        if not out.success:
            out.error = "the stream ended without a token chunk (no TTFT): request failed"
    except Exception:  # noqa: BLE001 (any failure of one request is counted, not raised)
        out.success = False
        out.error = traceback.format_exc()
    return out


async def _stream_data(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The ``data`` of each event line, as soon as the read that completes
    the line is handled."""
    lines = DataLines()
    async for read in response.content.iter_any():
        for data in lines.feed(read):
            yield data
    for data in lines.close():
        yield data
