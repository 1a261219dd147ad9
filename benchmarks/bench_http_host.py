"""The HTTP front end's own host time for one streaming completion, on CPU,
without an engine.

    python -m benchmarks.bench_http_host --prompt-len 512 --requests 500

``parse``: the body of a streaming ``/v1/completions`` request whose prompt
is ``--prompt-len`` token ids (``return_token_ids``, as ``bench_ttft``
sends), read into the request model as FastAPI's route does it
(``json.loads``, then ``CompletionRequest.model_validate``) and as
``FastLane`` does it (``IdsFirstCompletionRequest.model_validate_json``);
the best mean of several ``timeit`` rounds.

``request``: ``create_app``'s ASGI app called in process (uvloop) with that
request, its engine a stand-in that accepts it at once and answers two
deltas soon after; the latency trace on (``ipc/trace.py``, to a temporary
file); the median gap between consecutive front-end stages over
``--requests`` requests (after ``--warmup``). Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import timeit

STAGES = ["http_receive", "http_handler", "http_tokenized", "http_submitted",
          "http_delta_received", "http_chunk_written"]


def request_body(prompt: list[int]) -> bytes:
    return json.dumps({"prompt": prompt, "max_tokens": 16, "temperature": 0.0,
                       "ignore_eos": True, "stream": True, "return_token_ids": True}).encode()


def time_parse(body: bytes, number: int = 2000) -> dict:
    from serving.http.protocol import CompletionRequest, IdsFirstCompletionRequest

    ways = {"fastapi_route_us": lambda: CompletionRequest.model_validate(json.loads(body)),
            "fast_lane_us": lambda: IdsFirstCompletionRequest.model_validate_json(body)}
    return {name: round(min(timeit.repeat(way, number=number, repeat=7)) / number * 1e6, 1)
            for name, way in ways.items()}


class StandInLink:
    """The engine client's face: accepts each request at once, then (after
    ``delay_s``) answers two deltas, the second finishing it."""

    def __init__(self, delay_s: float = 0.0005) -> None:
        self.count = 0
        self.delay_s = delay_s

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def new_id(self) -> str:
        self.count += 1
        return f"http-{self.count}"

    def submit(self, request_id, prompt, params, queue, *options, **named) -> None:
        """Accept at once; the real link's further arguments (priority, the
        request's reasoning, cache and adapter options) change nothing here."""
        from ipc import trace
        from ipc.engine_messages import Delta, RequestAccepted

        if trace.enabled:
            trace.mark("http_submitted", request_id)
        queue.put_nowait(RequestAccepted(request_id=request_id, prompt_token_ids=prompt))

        def deliver() -> None:
            if trace.enabled:
                trace.mark("http_delta_received")
            queue.put_nowait(Delta(request_id=request_id, token_ids=[5], text="a",
                                   finished=False))
            queue.put_nowait(Delta(request_id=request_id, token_ids=[6], text="b",
                                   finished=True, finish_reason="length"))

        asyncio.get_running_loop().call_later(self.delay_s, deliver)

    def abort(self, request_id) -> None:
        pass

    def forget(self, request_id) -> None:
        pass


async def call_app(app, body: bytes) -> None:
    """One POST /v1/completions, as uvicorn's httptools protocol calls the app."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    status = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected

    async def send(message) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"the request was answered {status}")


async def time_requests(bodies: list[bytes], warmup: int, trace_path: str) -> dict:
    from checkpoint.tiny_model import build_tokenizer
    from checkpoint.tokenizer import Tokenizer
    from ipc import trace
    from serving.http.app import create_app

    app = create_app(StandInLink(), Tokenizer(build_tokenizer()), ["bench"], 1 << 20)
    for body in bodies[:warmup]:
        await call_app(app, body)
    open(trace_path, "w").close()
    for body in bodies[warmup:]:
        await call_app(app, body)
    requests: list[dict[str, int]] = []
    for event in trace.read(trace_path):
        if event.stage == "http_receive":
            requests.append({})
        requests[-1].setdefault(event.stage, event.t_ns)
    gaps = {}
    for a, b in zip(STAGES, STAGES[1:]):
        gaps[f"{a}->{b}_us"] = round(statistics.median(
            (r[b] - r[a]) / 1e3 for r in requests), 1)
    return {"requests": len(requests), **gaps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    rng = random.Random(0)
    bodies = [request_body([rng.randrange(32000) for _ in range(args.prompt_len)])
              for _ in range(args.warmup + args.requests)]
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = os.path.join(tmp, "trace")
        os.environ["TPRUN_TRACE_FILE"] = trace_path  # before ipc.trace is imported
        import uvloop

        summary = {"prompt_len": args.prompt_len, "parse": time_parse(bodies[0]),
                   "request": uvloop.run(time_requests(bodies, args.warmup, trace_path))}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
