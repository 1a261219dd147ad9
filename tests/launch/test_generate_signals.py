"""``tprun generate`` stopped by a signal cleans up like a normal exit.

SIGTERM becomes ``SystemExit(143)`` in the tprun process, so ``LLM``'s
context manager runs: the workers are shut down and the executor's socket
directory is removed; then one line says so, exit code 143. Ctrl-C (SIGINT
to the whole process group, as a terminal sends it) does the same and says
so in one line, exit code 130.
A launch killed with SIGKILL cannot clean up: the next launch removes its
directory (its owner pid is gone) and no one else's. Each run is started
with its own ``TMPDIR``, so the test sees exactly the directories it made.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.proc_utils import ROOT, pythonpath, reap_session, session_pids, socket_dirs


def _generate_then_signal(tmp_path, send) -> tuple[subprocess.Popen, str, str, list[int]]:
    """Start a long TP=2 generate, call ``send(proc)`` once it generates;
    returns (process, stdout, stderr, leftover pids)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    # PYTHONFAULTHANDLER: a launch that hangs after the signal is sent SIGABRT
    # below and prints every thread's stack, so the failure says where it sat.
    env = dict(os.environ, PYTHONPATH=pythonpath(), TMPDIR=str(tmpdir),
               TPRUN_CACHE=str(tmp_path / "cache"), PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "--nproc-per-node", "2", "generate", "--model", "tiny",
         "--device", "cpu", "--prompt-token-ids", "1,2,3", "--max-tokens", "3000",
         "--ignore-eos", "--json"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        # As from a terminal: a parent started in the background passes SIGINT
        # down ignored, and Python then installs no KeyboardInterrupt handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 90
        # Started: both workers are up and this run's socket directory exists.
        while not (any(str(proc.pid) in d for d in socket_dirs(str(tmpdir)))
                   and len(session_pids(proc.pid)) == 3):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "tprun generate did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # into the generation
        assert proc.poll() is None, "finished before the signal: raise --max-tokens"
        send(proc)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler prints the stacks
            out, err = proc.communicate(timeout=10)
            pytest.fail(f"tprun did not exit within 30 s of the signal; its stacks:\n{err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc, out, err, reap_session(proc.pid, grace_s=10)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_mid_generation_removes_the_socket_directory(tmp_path):
    proc, out, err, leftovers = _generate_then_signal(
        tmp_path, lambda p: p.send_signal(signal.SIGTERM))
    assert proc.returncode == 128 + signal.SIGTERM, err
    *before, last = err.splitlines()
    assert last == "tprun: stopped by SIGTERM"
    assert all(line.startswith("tprun generate: loading tiny") for line in before), err
    assert leftovers == []
    assert socket_dirs(str(tmp_path / "tmp")) == [], "the socket directory was left behind"
    assert out == ""  # nothing half-printed


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_is_one_line_and_exit_code_130(tmp_path):
    proc, out, err, leftovers = _generate_then_signal(
        tmp_path, lambda p: os.killpg(p.pid, signal.SIGINT))
    assert proc.returncode == 130, err
    *before, last = err.splitlines()
    assert last == "tprun: interrupted"
    assert all(line.startswith("tprun generate: loading tiny") for line in before), err
    assert leftovers == []
    assert socket_dirs(str(tmp_path / "tmp")) == []
    assert out == ""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_next_launch_removes_the_directory_of_a_killed_one(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    live = tmpdir / f"tprun-{os.getpid()}-alive000"  # owner alive: must stay
    live.mkdir()
    proc, _, _, _ = _generate_then_signal(tmp_path, lambda p: p.send_signal(signal.SIGKILL))
    assert proc.returncode == -signal.SIGKILL
    stale = [d for d in socket_dirs(str(tmpdir)) if str(proc.pid) in d]
    assert len(stale) == 1, "SIGKILL leaves the directory (nothing can remove it then)"
    env = dict(os.environ, PYTHONPATH=pythonpath(), TMPDIR=str(tmpdir),
               TPRUN_CACHE=str(tmp_path / "cache"))
    again = subprocess.run(
        [sys.executable, "-m", "launch", "--nproc-per-node", "2", "generate", "--model", "tiny",
         "--device", "cpu", "--prompt-token-ids", "1,2", "--max-tokens", "2", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert sorted(socket_dirs(str(tmpdir))) == [live.name]
