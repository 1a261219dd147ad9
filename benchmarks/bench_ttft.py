"""Time to first token at low load: over HTTP (``tprun serve``) and in process.

    python -m benchmarks.bench_ttft --shape 8b --prompt-len 512
    python -m benchmarks.bench_ttft --shape tiny --device cpu --dtype float32   (CPU)

HTTP: starts ``tprun serve --http-port 0`` (``python -m launch``, as users
run it; model of ``--shape`` with random weights, ``--load-format dummy``)
bound to 127.0.0.1 on a free port, with the latency trace on
(``ipc/trace.py``: ``TPRUN_TRACE_FILE``), then sends ``--warmup`` and
``--num-requests`` streaming ``/v1/completions`` requests one at a time, each
a prompt of ``--prompt-len`` random token ids that no other request of the
run shares (no prefix-cache hit), greedy, ``max_tokens`` ``--max-tokens``, ``ignore_eos``,
``return_token_ids`` (every token gets its chunk, whatever its text). Each
client of ``--clients`` sends them all: ``raw`` (this file's HTTP/1.1 over
one keep-alive socket, TCP_NODELAY, the request in one ``send``; the figures
of record), ``httpx`` and ``openai`` (the official client). TTFT is from
just before the request is sent to the arrival of the first chunk with a
token; ITL is the gap between token arrivals.

In process, after the server has stopped (so one model holds the device at
a time): the same prompts through ``LLM``'s engine, with the in-process
executor (``uni``, what ``LLM`` uses at TP=1) and the worker daemon
(``mp``, what ``tprun serve`` uses), with ``max_tokens`` 1 and with
``--max-tokens`` (its own prompts); TTFT from ``add_request`` to the first
delta.

Breakdown (``breakdown``): for each HTTP request of the ``raw`` client, the
trace's stages (ipc/trace.py lists them) that fall between its send and its
end; each stage's median offset from the send, and the median gap between
consecutive stages (each happens before the next: a sender marks before
it sends). ``worker_step_ms``: from the worker's reading the prefill
plan to its sampling queued (the forward pass on CPU, the host's launches
on CUDA); ``outside_worker_step_ms``: the TTFT less that, per request (on
CPU, the serving path's own time). ``next_step_sent`` is the step published after the
prefill step and before its output was absorbed (async scheduling; an
offset only, beside the chain).

Checks (``check``): every request got its tokens; the first token of each
prompt over HTTP equals the in-process one (greedy); the trace has every
stage of every request. A failed check is listed in the summary and the
exit code is 1. Prints a JSON summary last.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from benchmarks.common import emit_summary
from benchmarks.shapes import SHAPES, shape_config, write_shape
from ipc import trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_READY = re.compile(r"HTTP server ready on http://([\d.]+):(\d+)")

# The stages of the first token's trip, in order (ipc/trace.py);
# ``client_sent`` and ``client_received`` are this client's.
STAGES = ("client_sent", "http_receive", "http_handler", "http_tokenized", "http_submitted",
          "engine_received", "engine_added", "step_scheduled", "step_sent", "worker_received",
          "worker_forward_start", "worker_forward_queued", "worker_sampled",
          "worker_output_sent", "step_output", "delta_sent",
          "http_delta_received", "http_chunk_written", "client_received")
_STEP_STAGES = ("step_sent", "worker_received", "worker_forward_start", "worker_forward_queued",
                "worker_sampled", "worker_output_sent",
                "step_output")


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Token ids in [1000, 100000) (away from special tokens), within ``vocab``."""
    rng = random.Random(seed)
    low, high = min(1000, vocab // 2), min(100000, vocab)
    return [[rng.randrange(low, high) for _ in range(length)] for _ in range(n)]


# ---- the server --------------------------------------------------------------
@dataclass
class Server:
    proc: subprocess.Popen
    log_path: str
    host: str = ""
    port: int = 0

    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


def start_server(model_dir: str, args, trace_path: str, log_path: str) -> Server:
    """``tprun serve --http-port 0`` on 127.0.0.1, in its own session; waits
    up to ``--start-timeout`` seconds for its ready line."""
    command = [sys.executable, "-m", "launch", "serve", "--model", model_dir,
               "--load-format", "dummy", "--device", args.device, "--dtype", args.dtype,
               "--host", "127.0.0.1", "--http-port", "0"]
    if args.max_model_len is not None:
        command += ["--max-model-len", str(args.max_model_len)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get(
        "PYTHONPATH")])), **{trace.ENV: trace_path})
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(proc, log_path)
    deadline = time.monotonic() + args.start_timeout
    try:  # also a SIGTERM (SystemExit) while waiting stops it
        while (match := _READY.search(server.output())) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tprun serve did not start:\n{server.output()[-4000:]}")
            time.sleep(0.1)
    except BaseException:
        stop_server(server)
        raise
    server.host, server.port = match.group(1), int(match.group(2))
    return server


def stop_server(server: Server, timeout_s: float = 60) -> None:
    """SIGTERM, then SIGKILL to its whole session if it has not exited in time."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()


# ---- HTTP clients ------------------------------------------------------------
@dataclass
class Streamed:
    """One streamed completion: when it was sent and when each token came (ns)."""

    sent_ns: int
    arrivals: list[tuple[int, list[int]]] = field(default_factory=list)
    end_ns: int = 0

    @property
    def token_ids(self) -> list[int]:
        return [t for _, ids in self.arrivals for t in ids]


def token_ids_of(event: dict) -> list[int]:
    """The token ids of one completion chunk (``return_token_ids``)."""
    return [t for choice in event.get("choices", []) for t in choice.get("token_ids") or []]


class RawHttpClient:
    """HTTP/1.1 over one keep-alive socket (TCP_NODELAY): a request is one
    ``sendall``; a chunked response is read as it comes, each server-sent
    event stamped with the time of the ``recv`` that completed it."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.t_ns = 0

    def close(self) -> None:
        self.sock.close()

    def stream(self, path: str, body: dict) -> Streamed:
        data = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        out = Streamed(time.monotonic_ns())
        self.sock.sendall(head + data)
        status, headers = self._head()
        if status != 200 or headers.get("transfer-encoding") != "chunked":
            raise RuntimeError(f"HTTP {status} {headers}: {self._rest(headers)!r}")
        for t_ns, event in self._events():
            if (ids := token_ids_of(event)):
                out.arrivals.append((t_ns, ids))
        out.end_ns = time.monotonic_ns()
        return out

    def _recv(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.t_ns = time.monotonic_ns()
        self.buf += data

    def _until(self, sep: bytes) -> bytes:
        while (i := self.buf.find(sep)) < 0:
            self._recv()
        out, self.buf = self.buf[:i], self.buf[i + len(sep):]
        return out

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._recv()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _head(self) -> tuple[int, dict[str, str]]:
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        return int(lines[0].split()[1]), headers

    def _rest(self, headers: dict[str, str]) -> bytes:
        if "content-length" in headers:
            return self._exactly(int(headers["content-length"]))
        return b""

    def _chunks(self):
        """(time, bytes) of each chunk of a chunked body."""
        while True:
            size = int(self._until(b"\r\n").split(b";")[0], 16)
            if size == 0:
                self._until(b"\r\n")  # no trailers
                return
            data = self._exactly(size)
            self._exactly(2)
            yield self.t_ns, data

    def _events(self):
        """(time, JSON) of each ``data:`` event until ``[DONE]``."""
        pending = b""
        for t_ns, data in self._chunks():
            pending += data
            *complete, pending = pending.split(b"\n\n")
            for block in complete:
                for line in block.split(b"\n"):
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[len(b"data: "):]
                    if payload != b"[DONE]":
                        yield t_ns, json.loads(payload)


class HttpxClient:
    """httpx's streaming response, one ``iter_lines`` line per event line."""

    def __init__(self, host: str, port: int, timeout_s: float):
        import httpx

        self.url = f"http://{host}:{port}"
        self.client = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def stream(self, path: str, body: dict) -> Streamed:
        out = Streamed(time.monotonic_ns())
        with self.client.stream("POST", self.url + path, json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    if (ids := token_ids_of(json.loads(line[len("data: "):]))):
                        out.arrivals.append((time.monotonic_ns(), ids))
        out.end_ns = time.monotonic_ns()
        return out


class OpenAIClient:
    """The official client (``completions.create(stream=True)``)."""

    def __init__(self, host: str, port: int, timeout_s: float):
        import openai

        self.client = openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="none",
                                    max_retries=0, timeout=timeout_s)
        self.model = self.client.models.list().data[0].id

    def close(self) -> None:
        self.client.close()

    def stream(self, path: str, body: dict) -> Streamed:
        fields = dict(body)
        extra = {"return_token_ids": fields.pop("return_token_ids"),
                 "ignore_eos": fields.pop("ignore_eos")}
        out = Streamed(time.monotonic_ns())
        for chunk in self.client.completions.create(model=self.model, **fields,
                                                    extra_body=extra):
            if (ids := token_ids_of(chunk.model_dump())):
                out.arrivals.append((time.monotonic_ns(), ids))
        out.end_ns = time.monotonic_ns()
        return out


CLIENTS = {"raw": RawHttpClient, "httpx": HttpxClient, "openai": OpenAIClient}


def request_body(prompt: list[int], max_tokens: int) -> dict:
    """A greedy streaming completion of ``max_tokens`` tokens, each with its id."""
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}


def run_http(server: Server, client_name: str, prompts: list[list[int]], warmup: list[list[int]],
             args) -> list[Streamed]:
    """The warm-up prompts, then the measured ones, one request at a time."""
    client = CLIENTS[client_name](server.host, server.port, args.request_timeout)
    try:
        for p in warmup:
            client.stream("/v1/completions", request_body(p, args.max_tokens))
        return [client.stream("/v1/completions", request_body(p, args.max_tokens))
                for p in prompts]
    finally:
        client.close()


# ---- in process --------------------------------------------------------------
def run_in_process(model_dir: str, runs: dict[int, list[list[int]]], warmup: list[list[int]],
                   executor: str, args) -> dict:
    """TTFT through ``LLM``'s engine, one prompt at a time: ``runs`` maps a
    max_tokens to its prompts; returns ``{max_tokens: [(ttft_ms, first
    token)]}``."""
    from engine import LLM, SamplingParams

    llm = LLM(model=model_dir, load_format="dummy", device=args.device, dtype=args.dtype,
              max_model_len=args.max_model_len, executor=executor)
    engine = llm.engine
    out = {}
    try:
        for max_tokens, prompts in runs.items():
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            for p in warmup:
                _first_token(engine, p, params)
            out[max_tokens] = [_first_token(engine, p, params) for p in prompts]
    finally:
        llm.shutdown()
    return out


def _first_token(engine, prompt: list[int], params) -> tuple[float, int]:
    """(ms from add_request to the first delta with a token, that token);
    steps on until the request has finished."""
    start = time.perf_counter()
    request = engine.add_request({"prompt_token_ids": prompt}, params)
    first = None
    while engine.has_unfinished_requests():
        for d in engine.step():
            if first is None and d.req_id == request.req_id and d.new_token_ids:
                first = ((time.perf_counter() - start) * 1e3, d.new_token_ids[0])
    if first is None:
        raise RuntimeError("the request finished without a token")
    return first


# ---- the breakdown -------------------------------------------------------------
def stage_times(events: list[trace.TraceEvent], request: Streamed) -> dict[str, int]:
    """The time (ns) of each stage of ``request``'s first token: the first
    event of the stage inside the request's window, step stages of the
    step that scheduled it, the later ones after that step's output."""
    window = [e for e in events if request.sent_ns <= e.t_ns <= request.end_ns]
    first_token_ns = request.arrivals[0][0] if request.arrivals else request.end_ns
    out = {"client_sent": request.sent_ns, "client_received": first_token_ns}

    def first(stage: str, after: int = 0, key: str | None = None) -> int | None:
        for e in window:
            if e.stage == stage and e.t_ns >= after and (key is None or e.key == key):
                return e.t_ns
        return None

    for stage in STAGES[1:7]:  # up to the engine's queueing the request
        if (t := first(stage)) is not None:
            out[stage] = t
    step = next((e for e in window if e.stage == "step_scheduled"), None)
    if step is None:
        return out
    out["step_scheduled"] = step.t_ns
    for stage in _STEP_STAGES:
        if (t := first(stage, step.t_ns, step.key)) is not None:
            out[stage] = t
    if "step_output" not in out:
        return out
    later = next((e for e in window if e.stage == "step_sent" and e.key != step.key
                  and step.t_ns < e.t_ns < out["step_output"]), None)
    if later is not None:
        out["next_step_sent"] = later.t_ns
    t = out["step_output"]
    for stage in ("delta_sent", "http_delta_received", "http_chunk_written"):
        if (found := first(stage, t)) is not None:
            out[stage] = t = found
    return out


def breakdown(events: list[trace.TraceEvent], requests: list[Streamed]) -> dict:
    """Median offset (ms) of each stage from the send, and the median gap
    between consecutive stages found in a request; ``missing`` counts the
    requests without each stage."""
    per_request = [stage_times(events, r) for r in requests]
    offsets, gaps, missing = {}, {}, {}
    for stage in (*STAGES, "next_step_sent"):
        values = [(t[stage] - t["client_sent"]) / 1e6 for t in per_request if stage in t]
        if len(values) < len(per_request) and stage != "next_step_sent":
            missing[stage] = len(per_request) - len(values)
        if values:
            offsets[stage] = round(statistics.median(values), 3)
    for times in per_request:
        present = [s for s in STAGES if s in times]
        for a, b in zip(present, present[1:]):
            gaps.setdefault(f"{a} -> {b}", []).append((times[b] - times[a]) / 1e6)
    worker = [(t["worker_sampled"] - t["worker_received"]) / 1e6 for t in per_request
              if "worker_sampled" in t and "worker_received" in t]
    outside = [(t["client_received"] - t["client_sent"]) / 1e6 - w
               for t, w in zip(per_request, worker)]
    return {"offset_ms_median": offsets,
            "gap_ms_median": {k: round(statistics.median(v), 3) for k, v in gaps.items()},
            "worker_step_ms_median": round(statistics.median(worker), 3) if worker else None,
            "outside_worker_step_ms_median": (round(statistics.median(outside), 3)
                                              if outside else None),
            "missing": missing}


# ---- summary and checks -----------------------------------------------------------
def latency_summary(requests: list[Streamed]) -> dict:
    """TTFT and ITL (ms): median, p90 and mean; a chunk of k tokens shares
    its gap among them."""
    ttft = [(r.arrivals[0][0] - r.sent_ns) / 1e6 for r in requests if r.arrivals]
    itl = []
    for r in requests:
        for (t0, _), (t1, ids) in zip(r.arrivals, r.arrivals[1:]):
            itl += [(t1 - t0) / 1e6 / len(ids)] * len(ids)
    return {"ttft_ms": _stats(ttft), "itl_ms": _stats(itl)}


def _stats(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    return {"median": round(statistics.median(values), 3),
            "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
            "mean": round(statistics.fmean(values), 3), "n": len(values)}


def check(http: dict[str, list[Streamed]], reference_first: list[int] | None, max_tokens: int,
          trace_breakdown: dict | None) -> list[str]:
    """What is wrong with the run; empty when every check passes.
    ``reference_first``: the first token of each prompt of the first client
    in process (None: not run)."""
    problems = []
    for k, (name, requests) in enumerate(http.items()):
        for i, r in enumerate(requests):
            ids = r.token_ids
            if len(ids) != max_tokens:
                problems.append(f"{name}: request {i} got {len(ids)} tokens, not {max_tokens}")
            elif k == 0 and reference_first is not None and ids[0] != reference_first[i]:
                problems.append(f"{name}: request {i}: first token {ids[0]} over HTTP, "
                                f"{reference_first[i]} in process")
    if trace_breakdown is not None and trace_breakdown["missing"]:
        problems.append(f"trace: stages missing (requests without them): "
                        f"{trace_breakdown['missing']}")
    return problems


# ---- main -------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--num-requests", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8,
                        help="tokens per HTTP request (ITL needs 2 or more)")
    parser.add_argument("--clients", nargs="+", default=["raw"], choices=sorted(CLIENTS),
                        help="HTTP clients, each sends every request; the first one's "
                        "requests give the breakdown")
    parser.add_argument("--executors", nargs="*", default=["uni", "mp"],
                        choices=("uni", "mp"), help="in-process runs (none: skip them)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="the server's and the in-process engine's (default: the "
                        "model's, as 'tprun serve' has it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--trace-out", default=None,
                        help="keep the server's latency trace (ipc/trace.py) in this file")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    # The server runs in its own session, out of reach of a signal sent to
    # this one: SIGTERM (``timeout``, a job runner) must unwind through
    # ``stop_server`` rather than end the process and leave it running.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with tempfile.TemporaryDirectory(prefix="tprun-ttft-") as work:
        summary = run_benchmark(args, write_shape(args.shape, os.path.join(work, "model")), work)
    emit_summary(summary, args.out)
    return 1 if summary["problems"] else 0


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def run_benchmark(args, model_dir: str, work: str) -> dict:
    vocab = shape_config(args.shape)["vocab_size"]

    def prompts(k: int, n: int = args.num_requests) -> list[list[int]]:
        return random_prompts(n, args.prompt_len, vocab, args.seed * 1000 + k)

    trace_path = os.path.join(work, "trace.txt")
    server = start_server(model_dir, args, trace_path, os.path.join(work, "serve.log"))
    try:  # every client its own prompts and warm-up prompts
        http = {name: run_http(server, name, prompts(2 * i), prompts(2 * i + 1, args.warmup),
                               args) for i, name in enumerate(args.clients)}
    finally:
        stop_server(server)
    if args.trace_out:
        shutil.copyfile(trace_path, args.trace_out)
    events = trace.read(trace_path)
    trace_breakdown = breakdown(events, http[args.clients[0]])
    in_process, reference_first = {}, None
    for executor in args.executors:
        runs = {1: prompts(0)}  # the first client's: the same first tokens
        if args.max_tokens != 1:
            runs[args.max_tokens] = prompts(100)
        runs = run_in_process(model_dir, runs, prompts(101, args.warmup), executor, args)
        in_process[executor] = {f"max_tokens_{k}": {"ttft_ms": _stats([t for t, _ in v])}
                                for k, v in runs.items()}
        if executor == args.executors[0]:
            reference_first = [token for _, token in runs[1]]
    summary = {"benchmark": "ttft", "shape": args.shape, "device": args.device,
               "dtype": args.dtype, "prompt_len": args.prompt_len,
               "num_requests": args.num_requests, "max_tokens": args.max_tokens,
               "http": {name: latency_summary(reqs) for name, reqs in http.items()},
               "in_process": in_process, "breakdown": trace_breakdown,
               "date": time.strftime("%Y-%m-%d")}
    if in_process:
        http_ttft = summary["http"][args.clients[0]]["ttft_ms"]["median"]
        base = in_process[args.executors[0]]["max_tokens_1"]["ttft_ms"]["median"]
        summary["http_over_in_process"] = round(http_ttft / base, 3)
        summary["http_minus_in_process_ms"] = round(http_ttft - base, 3)
    summary["problems"] = check(http, reference_first, args.max_tokens, trace_breakdown)
    return summary


if __name__ == "__main__":
    sys.exit(main())
