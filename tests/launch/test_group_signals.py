"""A job signal to every process of a busy launch is a shutdown; to one worker, a failure.

``systemctl stop`` (KillMode=control-group) and ``kill -TERM -PGID`` send
SIGTERM to the executor and its workers at once. While the engine serves
requests, a worker that died of it mid-step would fail the step in flight
and end the launch as a failure (exit 143, "worker rank 0 ... exited with
code -15"). Held here, under load at TP=1 and TP=2: the same clean stop as
an idle server (exit code 0, no error, no process or socket directory left).
A SIGTERM to one worker alone still fails the launch within seconds, naming
the rank (worker/job_signals.py tells the two apart), as does a worker
killed while the server has nothing to do.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time

import pytest

from engine import SamplingParams
from serving.client import EngineClient, EngineStoppedError
from tests.helpers.proc_utils import reap_session, socket_dirs
from tests.helpers.serve_utils import Served, start_server, stop_server

STREAMS = 4
# Deltas every stream has received before the signal: the engine is busy.
DELTAS_BEFORE = 20


def _stream(endpoint_file: str, index: int, counts: list[int]) -> None:
    """Stream one long request until the engine stops; its delta count in ``counts``."""
    params = SamplingParams(temperature=1.0, max_tokens=3500, ignore_eos=True)
    with EngineClient(endpoint_file, timeout_s=30) as client:
        request_id = client.submit({"prompt_token_ids": list(range(1, 200))}, params)
        try:
            for _ in client.stream(request_id):
                counts[index] += 1
        except EngineStoppedError:
            pass


@pytest.fixture
def socket_tmp() -> str:
    """A temp folder for the server's sockets with a short path (a Unix
    socket's address holds 107 bytes; a test's own folder can be long)."""
    return tempfile.mkdtemp(prefix="sig")


def _serve_under_load(tmp_path, socket_tmp: str,
                      nproc: int) -> tuple[Served, list[threading.Thread]]:
    """``tprun serve`` of ``tiny`` (its temp folder ``socket_tmp``), each of
    ``STREAMS`` clients streaming a long request into it."""
    served = start_server(tmp_path, "--nproc-per-node", str(nproc), "serve", "--model", "tiny",
                          "--device", "cpu", "--disable-log-stats", timeout_s=40,
                          env={"TMPDIR": socket_tmp, "TPRUN_LOG_LEVEL": "INFO"})
    counts = [0] * STREAMS
    threads = [threading.Thread(target=_stream, args=(served.endpoint_file, i, counts),
                                daemon=True) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while min(counts) < DELTAS_BEFORE:
        if served.proc.poll() is not None or time.monotonic() > deadline:
            stop_server(served)
            pytest.fail(f"the server did not stream {counts}:\n{served.output()}")
        time.sleep(0.05)
    return served, threads


def _ended(served: Served, threads: list[threading.Thread],
           timeout_s: float) -> tuple[int, str, float]:
    """(exit code, output, when it exited) once the server exits within
    ``timeout_s``; no process of its session may be left 5 s on."""
    try:
        code = served.proc.wait(timeout=timeout_s)
    except Exception:
        stop_server(served, signal.SIGKILL)
        raise
    exited_at = time.monotonic()
    for thread in threads:
        thread.join(timeout=10)
    assert reap_session(served.proc.pid, grace_s=5) == [], served.output()
    return code, served.output(), exited_at


def _worker_of_rank(served: Served, rank: int) -> int:
    for pid in served.pids():
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        if pid != served.proc.pid and environ.get(b"RANK") == str(rank).encode():
            return pid
    raise LookupError(f"no worker of rank {rank} among {served.pids()}")


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("nproc", [1, 2])
def test_group_sigterm_under_load_is_a_clean_shutdown(tmp_path, socket_tmp, nproc):
    served, threads = _serve_under_load(tmp_path, socket_tmp, nproc)
    os.killpg(served.proc.pid, signal.SIGTERM)
    code, output, _ = _ended(served, threads, timeout_s=20)
    assert code == 0, output
    assert " ERROR " not in output and "exited with code" not in output, output
    assert socket_dirs(socket_tmp) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_one_worker_under_load_fails_naming_its_rank(tmp_path, socket_tmp, sig):
    """Rank 0's all-reduce breaks when rank 1 dies: the one failure reported
    is rank 1's; rank 0's broken collective (a gloo traceback) is not shown."""
    served, threads = _serve_under_load(tmp_path, socket_tmp, 2)
    os.kill(_worker_of_rank(served, 1), sig)
    killed_at = time.monotonic()
    code, output, exited_at = _ended(served, threads, timeout_s=20)
    assert code == 1, output
    assert "worker rank 1" in output and f"exited with code {-sig}" in output, output
    assert "Traceback" not in output and "rank 0" not in output, output
    assert exited_at - killed_at < 5.0  # not the step timeout, nor the workers' grace
    assert socket_dirs(socket_tmp) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_worker_killed_while_the_server_is_idle_ends_it_naming_its_rank(tmp_path, socket_tmp):
    """No step is in flight to fail: the idle loop asks the engine's health,
    so the server does not stay up (answering /health) with a dead rank."""
    served = start_server(tmp_path, "--nproc-per-node", "2", "serve", "--model", "tiny",
                          "--device", "cpu", "--disable-log-stats", timeout_s=40,
                          env={"TMPDIR": socket_tmp})
    os.kill(_worker_of_rank(served, 1), signal.SIGKILL)
    killed_at = time.monotonic()
    code, output, exited_at = _ended(served, [], timeout_s=15)
    assert code == 1, output
    assert "worker rank 1" in output and "exited with code -9" in output, output
    assert exited_at - killed_at < 5.0
    assert socket_dirs(socket_tmp) == [] and not os.path.exists(served.endpoint_file)
