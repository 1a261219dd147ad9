"""Latency trace: monotonic timestamps of the stages a request passes through.

Off unless ``TPRUN_TRACE_FILE`` names a file when the process imports this
module (worker daemons inherit it from the executor's environment). Off, a
call site pays one module attribute test: every mark sits behind
``if trace.enabled:``. On, ``mark`` appends one line ``NS PID STAGE KEY``
(``time.monotonic_ns()``, the same clock in every process of the host) to
the file with one ``write`` on an ``O_APPEND`` descriptor, so lines of
several processes and threads never interleave. ``read`` parses the file.

Stages of one request, in the order the first token passes them (what
``benchmarks/bench_ttft.py`` reports; KEY in brackets):

    http_receive          the ASGI app is called (before the body is parsed)
    http_handler          the route runs (body parsed and validated)
    http_tokenized        the prompts are token ids
    http_submitted [id]   the generate request goes to the front end's socket
    engine_received [id]  the engine loop read it
    engine_added [id]     the engine checked and queued it
    step_scheduled [step] a plan with new requests was made
    step_sent [step]      the plan is published to the workers
    worker_received [step]  a worker decoded the plan
    worker_forward_start [step]  its runner applied the plan and built the
                          inputs; the forward pass (a graph replay or the
                          eager launches) is next
    worker_forward_queued [step]  the forward pass is queued
    worker_sampled [step]   its sampling is queued too
    worker_output_sent [step]  the output rank has the step's output (and sends it)
    step_output [step]    the engine has the step's output
    delta_sent [id]       the engine loop sends a delta to the front end
    http_delta_received   the front end read an ``Outputs`` message
    http_chunk_written    a body chunk goes to the HTTP server

``id`` is the front end's engine-request id (``http-N``); ``step`` the
plan's step id. A ``*_sent`` or ``*_submitted`` mark is taken just before
the message is handed to its socket, so the receiver's mark always comes
later: each stage of the list happens before the next.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

ENV = "TPRUN_TRACE_FILE"

path: str | None = os.environ.get(ENV) or None
enabled: bool = path is not None
_fd: int | None = None
_lock = threading.Lock()


def mark(stage: str, key: object = "") -> None:
    """Record that this process reached ``stage`` now (call it only when
    ``enabled``)."""
    global _fd
    line = f"{time.monotonic_ns()} {os.getpid()} {stage} {key}\n".encode()
    if _fd is None:
        with _lock:
            if _fd is None:
                _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(_fd, line)


@dataclass(frozen=True)
class TraceEvent:
    t_ns: int
    pid: int
    stage: str
    key: str


def read(trace_path: str) -> list[TraceEvent]:
    """Every event in the file, in time order."""
    events = []
    with open(trace_path) as f:
        for line in f:
            t_ns, pid, stage, *key = line.rstrip("\n").split(" ", 3)
            events.append(TraceEvent(int(t_ns), int(pid), stage, key[0] if key else ""))
    return sorted(events, key=lambda e: e.t_ns)
