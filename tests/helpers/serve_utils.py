"""``tprun serve`` for tests: started in its own session, its output in a file.

The output goes to a file, not a pipe, so a server that logs a lot (the
fuzz tests make it) can never block on a full pipe. ``stop_server`` leaves
no process of the session behind, whatever happened; and a server whose
test process dies without stopping it (killed by a timeout) gets SIGTERM
from the kernel (the parent-death signal), so it shuts down cleanly too.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.helpers.proc_utils import ROOT, pythonpath, reap_session, session_pids

_PR_SET_PDEATHSIG = 1


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process exits."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class Served:
    """A running ``tprun serve``: its process, endpoint and files."""

    proc: subprocess.Popen
    endpoint: str
    endpoint_file: str
    log_path: str

    @property
    def key_file(self) -> str:
        return self.endpoint_file + ".key"

    def output(self) -> str:
        """Everything it printed and logged so far (stdout and stderr)."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def pids(self) -> list[int]:
        """The server and its worker daemons."""
        return sorted(session_pids(self.proc.pid))


def start_server(tmp_path, *args: str, env: dict | None = None,
                 timeout_s: float = 90) -> Served:
    """Start ``python -m launch ARGS --endpoint-file ...``; wait for the endpoint file."""
    endpoint_file = str(tmp_path / "endpoint")
    log_path = str(tmp_path / "serve.log")
    full_env = dict(os.environ, PYTHONPATH=pythonpath(), TPRUN_CACHE=str(tmp_path / "cache"),
                    **(env or {}))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch", *args, "--endpoint-file", endpoint_file],
            cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_term_with_parent,
        )
    served = Served(proc, "", endpoint_file, log_path)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(endpoint_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(served)
            pytest.fail(f"tprun serve did not start:\n{served.output()}")
        time.sleep(0.1)
    with open(endpoint_file) as f:
        served.endpoint = f.read().strip()
    return served


def stop_server(served: Served, sig: int = signal.SIGTERM) -> tuple[int, str, list[int]]:
    """Send ``sig`` to the server; returns (exit code, output, leftover pids).
    Any process of its session still alive 10 s after it exits is killed."""
    proc = served.proc
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    leftovers = reap_session(proc.pid, grace_s=10)
    return proc.returncode, served.output(), leftovers


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` (VmRSS in /proc/PID/status), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise ValueError(f"no VmRSS for pid {pid}")
