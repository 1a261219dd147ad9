"""benchmarks/bench_ttft.py and the latency trace it reads (ipc/trace.py):
the trace's file format across processes, the breakdown on hand-made
events, the raw HTTP client on a hand-written chunked stream, the checks,
and (slow) the whole benchmark on CPU against ``tprun serve``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from benchmarks.bench_ttft import (
    STAGES,
    RawHttpClient,
    Streamed,
    breakdown,
    check,
    stage_times,
)
from ipc.trace import ENV, TraceEvent, read
from tests.helpers.proc_utils import ROOT, child_pids, pythonpath, reap_session, run_in_session

MS = 1_000_000  # ns


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=pythonpath(), **env))


@pytest.mark.timeout(120)
def test_trace_lines_of_two_processes(tmp_path):
    """Each process appends its own lines; ``read`` gives them in time order
    with their pid, stage and key; without the variable nothing is written."""
    path = str(tmp_path / "trace.txt")
    code = ("import os; from ipc import trace; assert trace.enabled; "
            "trace.mark('{0}', 7); trace.mark('{0}_end'); print(os.getpid())")
    pids = [int(_python(code.format(name), {ENV: path}).stdout) for name in ("one", "two")]
    events = read(path)
    assert [(e.pid, e.stage, e.key) for e in events] == [
        (pids[0], "one", "7"), (pids[0], "one_end", ""),
        (pids[1], "two", "7"), (pids[1], "two_end", "")]
    assert [e.t_ns for e in events] == sorted(e.t_ns for e in events)
    off = _python("from ipc import trace; print(trace.enabled)", {ENV: ""})
    assert off.stdout.strip() == "False"


def _events(t0: int, step: int, stale_step: int) -> list[TraceEvent]:
    """One request's trip (offsets in ms from ``t0``), with events of another
    step (``stale_step``, a previous request's) inside its window."""
    at = [("http_receive", 1, ""), ("http_handler", 2, ""), ("http_tokenized", 3, ""),
          ("http_submitted", 4, "http-1"), ("step_output", 4.5, str(stale_step)),
          ("delta_sent", 4.6, "http-0"), ("engine_received", 5, "http-1"),
          ("engine_added", 6, "http-1"), ("step_scheduled", 7, str(step)),
          ("step_sent", 8, str(step)), ("worker_received", 9, str(step)),
          ("worker_forward_start", 9.25, str(step)), ("step_sent", 9.5, str(step + 1)),
          ("worker_forward_queued", 19, str(step)), ("worker_sampled", 20, str(step)),
          ("worker_output_sent", 21, str(step)), ("step_output", 22, str(step)),
          ("delta_sent", 23, "http-1"), ("http_delta_received", 24, ""),
          ("http_chunk_written", 25, "")]
    return [TraceEvent(t0 + int(ms * MS), 1, stage, key) for stage, ms, key in at]


def test_stage_times_follow_the_scheduled_step():
    """The step stages are those of the step that scheduled the request, the
    later stages come after its output (a stale step's output and delta in
    the window are not taken), the next step is found beside the chain."""
    t0 = 10**12
    request = Streamed(t0, [(t0 + 26 * MS, [5]), (t0 + 30 * MS, [6])], t0 + 31 * MS)
    times = stage_times(_events(t0, step=12, stale_step=11), request)
    offsets = {stage: (t - t0) / MS for stage, t in times.items()}
    assert offsets == {
        "client_sent": 0, "http_receive": 1, "http_handler": 2, "http_tokenized": 3,
        "http_submitted": 4, "engine_received": 5, "engine_added": 6, "step_scheduled": 7,
        "step_sent": 8, "worker_received": 9, "worker_forward_start": 9.25,
        "next_step_sent": 9.5, "worker_forward_queued": 19, "worker_sampled": 20,
        "worker_output_sent": 21, "step_output": 22, "delta_sent": 23,
        "http_delta_received": 24, "http_chunk_written": 25, "client_received": 26}


def test_breakdown_medians():
    """Three requests whose worker step takes 11, 13 and 20 ms: the medians of
    offsets and gaps, and the time outside the worker step (TTFT 26 + extra
    - step), by hand."""
    events, requests = [], []
    for i, extra in enumerate((0, 2, 9)):
        t0 = 10**12 + i * 100 * MS
        trip = _events(t0, step=3 * i + 1, stale_step=3 * i)
        for k, e in enumerate(trip):  # the worker's sampling and all after it, later
            if e.stage in ("worker_sampled", "worker_output_sent", "step_output",
                           "http_delta_received", "http_chunk_written") or (
                    e.stage == "delta_sent" and e.key == "http-1"):
                trip[k] = TraceEvent(e.t_ns + extra * MS, e.pid, e.stage, e.key)
        events += trip
        requests.append(Streamed(t0, [(t0 + (26 + extra) * MS, [1])], t0 + 50 * MS))
    out = breakdown(sorted(events, key=lambda e: e.t_ns), requests)
    assert out["missing"] == {}
    assert out["offset_ms_median"]["worker_sampled"] == 22
    assert out["offset_ms_median"]["client_received"] == 28
    assert out["gap_ms_median"]["worker_forward_queued -> worker_sampled"] == 3  # 1 + extra
    assert out["gap_ms_median"]["http_chunk_written -> client_received"] == 1
    assert list(out["gap_ms_median"]) == [f"{a} -> {b}" for a, b in zip(STAGES, STAGES[1:])]
    assert out["worker_step_ms_median"] == 13
    assert out["outside_worker_step_ms_median"] == 15  # 26 + extra - (11 + extra)


def test_breakdown_counts_missing_stages():
    t0 = 10**12
    events = [e for e in _events(t0, 5, 4) if e.stage != "worker_output_sent"]
    out = breakdown(events, [Streamed(t0, [(t0 + 26 * MS, [1])], t0 + 30 * MS)])
    assert out["missing"] == {"worker_output_sent": 1}


def _serve_once(listener: socket.socket, responses: list[bytes]) -> None:
    """Accept one connection; answer each request (read to its body's end)
    with the next response, written in pieces."""
    conn, _ = listener.accept()
    with conn:
        buf = b""
        for response in responses:
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(4096)
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(buf) < length:
                buf += conn.recv(4096)
            buf = buf[length:]
            for k in range(0, len(response), 7):
                conn.sendall(response[k: k + 7])


def _chunked(*pieces: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n")


@pytest.mark.timeout(60)
def test_raw_client_reads_chunked_events_on_one_connection():
    """Events split across chunks, a chunk holding two events, one without
    token ids, then ``[DONE]``; a second request on the same connection."""
    ev = [json.dumps({"choices": [{"text": "", "token_ids": ids}]}).encode()
          for ids in ([3], [4, 5], [])]
    first = _chunked(b"data: " + ev[0][:5], ev[0][5:] + b"\n\n",
                     b"data: " + ev[1] + b"\n\ndata: " + ev[2] + b"\n\n", b"data: [DONE]\n\n")
    second = _chunked(b"data: " + ev[0] + b"\n\ndata: [DONE]\n\n")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        server = threading.Thread(target=_serve_once, args=(listener, [first, second]))
        server.start()
        client = RawHttpClient("127.0.0.1", listener.getsockname()[1], timeout_s=30)
        try:
            one = client.stream("/v1/completions", {"prompt": [1, 2]})
            two = client.stream("/v1/completions", {"prompt": [1]})
        finally:
            client.close()
        server.join(timeout=30)
    assert [ids for _, ids in one.arrivals] == [[3], [4, 5]] and one.token_ids == [3, 4, 5]
    assert one.sent_ns <= one.arrivals[0][0] <= one.arrivals[1][0] <= one.end_ns
    assert two.token_ids == [3]


def test_check_names_each_problem():
    good = Streamed(0, [(1, [7]), (2, [8])], 3)
    short = Streamed(0, [(1, [7])], 3)
    other = Streamed(0, [(1, [9]), (2, [8])], 3)
    assert check({"raw": [good, good]}, [7, 7], 2, {"missing": {}}) == []
    problems = check({"raw": [short, other], "httpx": [other]}, [7, 7], 2,
                     {"missing": {"step_output": 1}})
    assert problems == ["raw: request 0 got 1 tokens, not 2",
                        "raw: request 1: first token 9 over HTTP, 7 in process",
                        "trace: stages missing (requests without them): {'step_output': 1}"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_bench_ttft_on_cpu(tmp_path):
    """The whole benchmark (tiny shape): the first tokens over HTTP equal the
    in-process ones, the trace has every stage of every request, and each
    stage's median offset is at least the one before it (each stage happens
    before the next)."""
    out = tmp_path / "ttft.json"
    result, leftovers = run_in_session(
        [sys.executable, "-m", "benchmarks.bench_ttft", "--shape", "tiny", "--device", "cpu",
         "--dtype", "float32", "--prompt-len", "48", "--num-requests", "3", "--warmup", "1",
         "--max-tokens", "3", "--clients", "raw", "httpx", "--executors", "uni",
         "--out", str(out)], timeout=380, env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert leftovers == []
    s = json.loads(out.read_text())
    assert s["problems"] == []
    for client in ("raw", "httpx"):
        assert s["http"][client]["ttft_ms"]["n"] == 3 and s["http"][client]["itl_ms"]["n"] == 6
    assert s["in_process"]["uni"]["max_tokens_1"]["ttft_ms"]["n"] == 3
    assert s["in_process"]["uni"]["max_tokens_3"]["ttft_ms"]["n"] == 3
    offsets = s["breakdown"]["offset_ms_median"]
    chain = [offsets[stage] for stage in STAGES]
    assert chain == sorted(chain)
    assert all(gap >= 0 for gap in s["breakdown"]["gap_ms_median"].values())


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["starting", "running"])
def test_sigterm_stops_the_server(tmp_path, when):
    """The server runs in a session of its own, so a signal to the benchmark
    does not reach it: a SIGTERM (what ``timeout`` sends) must still stop it
    and its workers before the benchmark exits, whether it comes while the
    server starts or while requests run."""
    cmd = [sys.executable, "-m", "benchmarks.bench_ttft", "--shape", "tiny", "--device", "cpu",
           "--dtype", "float32", "--prompt-len", "16", "--num-requests", "100000",
           "--warmup", "0", "--max-tokens", "2", "--clients", "raw", "--executors"]
    env = dict(os.environ, PYTHONPATH=pythonpath(), TMPDIR=str(tmp_path),
               TPRUN_CACHE=str(tmp_path / "cache"))
    bench = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    servers: list[int] = []

    def server_ready() -> bool:
        logs = list(tmp_path.glob("tprun-ttft-*/serve.log"))
        return bool(logs) and "HTTP server ready" in logs[0].read_text(errors="replace")

    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and bench.poll() is None and not servers:
            servers = child_pids(bench.pid)
            time.sleep(0.05)
        assert bench.poll() is None and len(servers) == 1, "the benchmark's server did not start"
        if when == "starting":  # held while it waits for the ready line: the signal lands there
            bench.send_signal(signal.SIGSTOP)
        while time.monotonic() < deadline and not server_ready():
            time.sleep(0.05)
        assert server_ready()
        if when == "running":
            time.sleep(2)  # the benchmark has seen the ready line and sends requests
        bench.send_signal(signal.SIGTERM)
        bench.send_signal(signal.SIGCONT)
        assert bench.wait(timeout=90) == 128 + signal.SIGTERM
        assert reap_session(servers[0], grace_s=10) == []  # the server and its workers
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
        for server in servers:
            reap_session(server, grace_s=0)
