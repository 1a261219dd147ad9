"""``tprun generate`` stopped by SIGTERM cleans up like a normal exit.

SIGTERM becomes ``SystemExit(143)`` in the tprun process, so ``LLM``'s
context manager runs: the workers are shut down and the executor's socket
directory is removed. The run is started with its own ``TMPDIR``, so the
test sees exactly the directories it made.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.proc_utils import ROOT, pythonpath, reap_session, session_pids


def _socket_dirs(tmpdir: str) -> list[str]:
    return [d for d in os.listdir(tmpdir) if d.startswith("tprun-")]


@pytest.mark.timeout(120)
def test_sigterm_mid_generation_removes_the_socket_directory(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, PYTHONPATH=pythonpath(), TMPDIR=str(tmpdir),
               TPRUN_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "--nproc-per-node", "2", "generate", "--model", "tiny",
         "--device", "cpu", "--prompt-token-ids", "1,2,3", "--max-tokens", "3000",
         "--ignore-eos", "--json"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        # Started: both workers are up and the socket directory exists.
        while not (_socket_dirs(str(tmpdir)) and len(session_pids(proc.pid)) == 3):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "tprun generate did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # into the generation
        assert proc.poll() is None, "finished before the signal: raise --max-tokens"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    leftovers = reap_session(proc.pid, grace_s=10)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert leftovers == []
    assert _socket_dirs(str(tmpdir)) == [], "the socket directory was left behind"
    assert out == ""  # nothing half-printed
