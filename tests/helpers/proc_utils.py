"""Process helpers for tests: run tprun in its own session, find leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# The repository root (this file is tests/helpers/proc_utils.py).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pythonpath() -> str:
    """ROOT first, then whatever PYTHONPATH the tests run with."""
    return os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))


def socket_dirs(directory) -> list[str]:
    """The tprun private directories (``ipc.endpoints.private_directory``) in ``directory``."""
    return [d for d in os.listdir(directory) if d.startswith("tprun-")]


def long_directory(root, total: int) -> str:
    """A path under ``root`` exactly ``total`` bytes long (not created): for
    socket paths near a Unix socket address's limit."""
    assert len(str(root)) + 2 <= total
    return os.path.join(root, "d" * (total - len(str(root)) - 1))


def _live_processes():
    """(pid, parent pid, session id) of every process not a zombie (from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            yield int(entry), int(fields[1]), int(fields[3])


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid``."""
    return [pid for pid, _, session in _live_processes() if session == sid]


def child_pids(parent: int) -> list[int]:
    """Live child processes of ``parent``."""
    return [pid for pid, ppid, _ in _live_processes() if ppid == parent]


def run_in_session(cmd: list[str], timeout: float, env: dict | None = None,
                   cwd: str = ROOT):
    """Run ``cmd`` in a new session; returns (result, leftover pids).

    Leftovers are processes of that session still alive 5 s after it exits;
    they are killed before returning, so a failing test leaves none.
    """
    full_env = dict(os.environ, PYTHONPATH=pythonpath(), **(env or {}))
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    leftovers = reap_session(proc.pid, grace_s=5)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), leftovers


def reap_session(sid: int, grace_s: float) -> list[int]:
    """Processes of session ``sid`` still alive ``grace_s`` after its leader
    exited; they are killed before returning, so a failing test leaves none."""
    deadline = time.monotonic() + grace_s
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftovers = session_pids(sid)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return leftovers


def run_tprun(args: list[str], timeout: float, env: dict | None = None):
    """``python -m launch ARGS`` through ``run_in_session``."""
    return run_in_session([sys.executable, "-m", "launch", *args], timeout, env)
