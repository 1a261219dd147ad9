"""``tprun serve --http-port`` under load and when its engine dies.

Load: 500 concurrent streaming requests through ``openai.AsyncOpenAI``
against ``tiny`` on CPU; each answer must be complete and equal to the
same request run alone (greedy), nothing running once they are done, and
nothing left of the server after its shutdown. Death: a worker killed
mid-request turns the open requests into HTTP 503 answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import httpx
import openai
import pytest

from tests.helpers.http_utils import metric, start_http, stop_http, wait_for_metric

NUM_REQUESTS = 500
NUM_PROMPTS = 25
MAX_TOKENS = 8


async def _stream_one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, str, int]:
    stream = await client.completions.create(
        model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True})
    text, reason, tokens = "", None, None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.text
            reason = choice.finish_reason or reason
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return text, reason, tokens


async def _run(url: str, prompts: list[str], concurrent: bool) -> list[tuple[str, str, int]]:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                                  timeout=600) as client:
        if concurrent:
            return await asyncio.gather(*(_stream_one(client, p) for p in prompts))
        return [await _stream_one(client, p) for p in prompts]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_500_concurrent_streams_equal_each_alone(tmp_path):
    server = start_http(tmp_path, "--nproc-per-node", "1", "serve", "--model", "tiny",
                        "--device", "cpu", "--disable-log-stats")
    try:
        prompts = [f"Request {i}: once upon a time" for i in range(NUM_PROMPTS)]
        alone = dict(zip(prompts, asyncio.run(_run(server.url, prompts, concurrent=False))))
        load = [prompts[i % NUM_PROMPTS] for i in range(NUM_REQUESTS)]
        answers = asyncio.run(_run(server.url, load, concurrent=True))
        assert len(answers) == NUM_REQUESTS
        for prompt, answer in zip(load, answers):
            text, reason, tokens = answer
            assert reason in ("length", "stop") and tokens is not None
            assert answer == alone[prompt], prompt
        assert wait_for_metric(server.url, "tprun:num_requests_running", lambda v: v == 0) == 0
        assert metric(server.url, "tprun:num_requests_waiting") == 0
        assert metric(server.url, "tprun:kv_cache_usage_perc") == 0
    finally:
        code, output, leftovers = stop_http(server)
    assert code == 0 and not leftovers, output


@pytest.mark.timeout(180)
def test_dead_engine_answers_503(tmp_path):
    server = start_http(tmp_path, "--nproc-per-node", "1", "serve", "--model", "tiny",
                        "--device", "cpu", "--disable-log-stats")
    answers: list[httpx.Response] = []
    body = {"model": "tiny", "prompt": "Tell me a long story", "max_tokens": 3000,
            "temperature": 0, "ignore_eos": True}
    request = threading.Thread(target=lambda: answers.append(
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)))
    try:
        request.start()
        assert wait_for_metric(server.url, "tprun:num_requests_running", lambda v: v == 1) == 1
        workers = [pid for pid in server.served.pids() if pid != server.proc.pid]
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        request.join(timeout=120)
        assert answers and answers[0].status_code == 503, answers
        error = answers[0].json()["error"]
        assert "engine stopped" in error["message"] and error["code"] == 503
    finally:
        code, output, leftovers = stop_http(server)
    assert code != 0 and not leftovers, output
