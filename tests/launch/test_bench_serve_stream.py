"""``tprun bench serve``'s client against a stand-in server whose bytes
and pauses the test writes (``tests.helpers.sse_stand_in``): how a
stream's reads become token chunks (split JSON, several events in one
read, CRLF and CR line endings, comments, ``[DONE]``, a last line with no
line ending), what a failed request records, the request bodies and
headers as vLLM's benchmark sends them, the connection pool (keep-alive
under --max-concurrency, no cap without it), the request timeout (the
whole request, as vLLM's), the client queue time and the ready check's
deadline. Counts and orders only; the timing facts used are causal (a
gap the server paused for is no shorter than the pause; a request the
concurrency gate held is sent after another one ended)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from launch.bench_serve.request import RequestInput, send_request
from tests.helpers.bench_runs import bench
from tests.helpers.sse_stand_in import HOLD, StandIn, event, running, token, usage


def _send(url: str, backend: str = "openai", given: RequestInput | None = None):
    async def go():
        async with aiohttp.ClientSession() as session:
            return await send_request(session, backend, given or RequestInput(
                prompt="hi", api_url=f"{url}/v1/completions", prompt_len=3, output_len=4,
                model="m"))

    return asyncio.run(go())


@pytest.mark.timeout(60)
def test_reads_split_anywhere_give_one_chunk_per_event():
    first, second = json.dumps(token("ab")).encode(), json.dumps(token("c")).encode()
    accented = b"data: " + json.dumps(token("\u00e9"), ensure_ascii=False).encode() + b"\n\n"
    cut = accented.index("\u00e9".encode()) + 1  # inside the character's two bytes
    pieces = [
        (b": ping\r\n\r\n", 0.0),
        (b"data: " + first[:9], 0.3),  # a JSON object over two reads
        (first[9:] + b"\r\n\r\ndata:" + second + b"\r\r", 0.3),  # CRLF; CR; no space
        (event(token("")) + accented[:cut], 0.0),
        (accented[cut:] + event(usage(7, 5)) + event("[DONE]"), 0.0),
    ]
    stand_in = StandIn(lambda i, body: pieces)
    with running(stand_in) as url:
        out = _send(url)
    assert out.success, out.error
    # Chunks: "ab", "c", "" (a choice with empty text still counts), "é".
    assert out.generated_text == "abc\u00e9"
    assert len(out.itl) == 3
    assert out.ttft + sum(out.itl) == pytest.approx(out.latency)
    # "ab" is whole only with the read after the pause; "" a pause after "c"
    # (a gap timed by the client: its clock may start a little after the
    # server's pause did, so the bound keeps a margin).
    assert out.ttft >= 0.2 and out.itl[1] >= 0.2
    # The usage event moves no timing and gives the server's counts.
    assert (out.output_tokens, out.prompt_len) == (5, 7)


@pytest.mark.timeout(60)
def test_several_events_in_one_read_and_a_last_line_without_ending():
    pieces = [(event(token("a")) + event(token("b")) + event(token("c")), 0.0),
              (b"data: " + json.dumps(token("d")).encode(), 0.0)]
    with running(StandIn(lambda i, body: pieces)) as url:
        out = _send(url)
    assert out.success and out.generated_text == "abcd" and len(out.itl) == 3
    assert out.output_tokens == 0  # no usage: the tokenizer counts the text later


@pytest.mark.timeout(60)
def test_failures_are_recorded_not_raised():
    error = {"error": {"message": "bad model", "type": "NotFoundError", "code": 404}}
    with running(StandIn(lambda i, body: [(json.dumps(error).encode(), 0.0)],
                         status=404)) as url:
        refused = _send(url)
    assert not refused.success and refused.error.startswith("HTTP 404")
    assert "bad model" in refused.error
    # No token chunk before [DONE]: failed (vLLM's rule: no TTFT).
    with running(StandIn(lambda i, body: [(event(error) + event("[DONE]"), 0.0)])) as url:
        empty = _send(url)
    assert not empty.success and "no TTFT" in empty.error
    # An error event after tokens ends nothing: the chunks before it count (as vLLM's).
    with running(StandIn(lambda i, body: [(event(token("a")) + event(error)
                                           + event("[DONE]"), 0.0)])) as url:
        partial = _send(url)
    assert partial.success and partial.generated_text == "a"
    # A body that is no JSON: failed with the parse error.
    with running(StandIn(lambda i, body: [(b"data: {oops\n\n", 0.0)])) as url:
        broken = _send(url)
    assert not broken.success and "JSONDecodeError" in broken.error




def _three_tokens(i, body):
    return [(event(token("x")), 0.0)] * 3 + [(event(usage(8, 3)) + event("[DONE]"), 0.0)]


@pytest.mark.timeout(120)
def test_chat_bodies_headers_and_keep_alive_under_max_concurrency(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")

    def chat(i, body):
        return [(event({"choices": [{"index": 0, "delta": {"content": "y"}}]}), 0.02)] * 3 + \
            [(event(usage(9, 3)) + event("[DONE]"), 0.0)]

    stand_in = StandIn(chat)
    with running(stand_in) as url:
        code, saved = bench(url, tmp_path, "--backend", "openai-chat", "--endpoint",
                             "/v1/chat/completions", "--num-prompts", "6",
                             "--max-concurrency", "2", "--header", "x-a=1=2", "x-b = c",
                             "--extra-body", '{"top_k": 5, "max_completion_tokens": 2}',
                             "--temperature", "0", "--request-id-prefix", "r-")
    assert code == 0
    assert (saved["completed"], saved["total_output_tokens"]) == (6, 18)
    # Six requests over the two connections the limit allows, each kept alive.
    assert stand_in.connections == 2 and len(stand_in.requests) == 6
    assert saved["max_concurrent_requests"] <= 2
    first = stand_in.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["body"]["messages"][0]["content"] == [
        {"type": "text", "text": first["body"]["messages"][0]["content"][0]["text"]}]
    assert {k: v for k, v in first["body"].items() if k != "messages"} == {
        "model": "m", "max_completion_tokens": 2, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True, "top_k": 5,
        "temperature": 0.0}
    assert (first["headers"]["authorization"], first["headers"]["x-a"],
            first["headers"]["x-b"]) == ("Bearer sk-test", "1=2", "c")
    assert sorted(r["headers"]["x-request-id"] for r in stand_in.requests) == \
        [f"r-{i}" for i in range(6)]


@pytest.mark.timeout(120)
def test_client_queue_time_counts_from_each_requests_arrival(tmp_path):
    """All at once (rate inf): every request arrives before the first is
    sent, so each one's send less its queue time (its arrival, vLLM's
    task creation) lies before the first send; the two the gate held
    waited until one of the first two ended."""
    stand_in = StandIn(_three_tokens)
    with running(stand_in) as url:
        code, saved = bench(url, tmp_path, "--num-prompts", "4", "--max-concurrency", "2")
    assert code == 0 and saved["completed"] == 4
    starts, queued = saved["start_times"], saved["queue_times"]
    arrivals = [s - q for s, q in zip(starts, queued)]
    assert max(arrivals) <= min(starts)
    first_end = min(s + e for s, e in zip(starts, saved["latencies"]))
    assert sorted(starts)[2] >= first_end


@pytest.mark.timeout(120)
def test_no_concurrency_limit_keeps_every_request_in_flight(tmp_path):
    """150 requests sent at once, each answered only after all have
    arrived: the client holds 150 connections at one time (no pool cap
    queues any of them)."""
    n = 150
    stand_in = StandIn(_three_tokens, barrier=n)
    with running(stand_in) as url:
        code, saved = bench(url, tmp_path, "--num-prompts", str(n))
    assert code == 0 and saved["completed"] == n
    assert stand_in.connections == n and saved["max_concurrent_requests"] == n


@pytest.mark.timeout(120)
def test_the_request_timeout_bounds_the_whole_request(tmp_path, monkeypatch):
    """vLLM's timeout (6 h) is the whole request's: a stream that keeps
    sending pings past it fails, whatever the gap between its reads."""
    import launch.bench_serve.run

    monkeypatch.setattr(launch.bench_serve.run, "REQUEST_TIMEOUT_S", 1.0)

    def slow(i, body):
        return ([(event(token("a")), 0.2)] + [(b": ping\n\n", 0.2)] * 15
                + [(event(token("b")) + event("[DONE]"), 0.0)])

    with running(StandIn(slow)) as url:
        code, saved = bench(url, tmp_path, "--num-prompts", "1")
    assert code == 0
    assert (saved["completed"], saved["failed"]) == (0, 1)
    assert "TimeoutError" in saved["errors"][0]


@pytest.mark.timeout(60)
def test_a_ready_check_on_a_server_that_never_answers_ends_at_its_deadline(tmp_path, capsys):
    with running(StandIn(lambda i, body: HOLD)) as url:
        code, saved = bench(url, tmp_path, "--num-prompts", "1",
                             "--ready-check-timeout-sec", "1")
    assert code == 1 and saved is None
    assert "no answer within 1 s" in capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option", [("--request-rate", "0"), ("--burstiness", "0"),
                                    ("--request-rate", "-2")])
def test_a_bad_rate_is_refused_before_any_request(tmp_path, capsys, option):
    stand_in = StandIn(_three_tokens)
    with running(stand_in) as url:
        code, saved = bench(url, tmp_path, "--num-prompts", "2", "--num-warmups", "2",
                             "--request-rate", "4", *option)
    assert code == 2 and saved is None and stand_in.requests == []
    assert option[0] in capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra_body", ["[1]", '"top_k"', "{oops"])
def test_an_extra_body_that_is_no_json_object_is_an_argument_error(tmp_path, capsys,
                                                                  extra_body):
    stand_in = StandIn(_three_tokens)
    with running(stand_in) as url, pytest.raises(SystemExit) as stopped:
        bench(url, tmp_path, "--num-prompts", "1", "--extra-body", extra_body)
    assert stopped.value.code == 2 and stand_in.requests == []
    assert "--extra-body" in capsys.readouterr().err
