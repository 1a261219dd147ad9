"""A spawned worker tells a SIGTERM the executor received too from one sent to it alone.

The executor here is a small script: its SIGTERM handler notes nothing, as
the launcher's handler has not yet run while its main thread is busy, so
only the delivery record (``executor.stop_signals``) can tell. Its worker
is a probe that does what ``python -m worker`` does first
(``worker.job_signals.defer_to_executor``), then works for ``WORK_S``
seconds and exits 0, as a worker does once the executor stops it.
"""

from __future__ import annotations

import sys

import pytest

from tests.helpers.proc_utils import run_in_session

WORK_S = 2.0

PROBE = f"""
import sys, time
from worker.job_signals import defer_to_executor
defer_to_executor()
open(sys.argv[1], "w").write("ready")
time.sleep({WORK_S})
"""

EXECUTOR = """
import os, signal, sys, time
from executor import stop_signals
from executor.multiproc import spawn_worker
mode, probe_dir, ready = sys.argv[1:]
signal.signal(signal.SIGTERM, lambda *_: None)
if mode == "earlier":  # received, and lived on, before the worker started
    stop_signals.delivery_record()
    os.kill(os.getpid(), signal.SIGTERM)
env = dict(os.environ, PYTHONPATH=os.pathsep.join([probe_dir, *sys.path]))
worker = spawn_worker("probe_worker", [ready], env)
while not os.path.exists(ready):
    time.sleep(0.01)
if mode == "group":
    os.kill(os.getpid(), signal.SIGTERM)
os.kill(worker.pid, signal.SIGTERM)
sent = time.monotonic()
code = worker.wait(timeout=20)
print(code, time.monotonic() - sent, stop_signals.shared_with_parent(-signal.SIGTERM, wait_s=0))
"""


def _run(tmp_path, mode: str) -> tuple[int, float, str]:
    """(the worker's exit code, seconds from its SIGTERM to its exit, whether
    the executor would count a worker's death by SIGTERM as its own signal's)."""
    (tmp_path / "probe_worker.py").write_text(PROBE)
    result, leftovers = run_in_session(
        [sys.executable, "-c", EXECUTOR, mode, str(tmp_path), str(tmp_path / "ready")],
        timeout=40)
    assert result.returncode == 0 and leftovers == [], result.stderr
    code, seconds, shared = result.stdout.split()
    return int(code), float(seconds), shared


@pytest.mark.timeout(60)
def test_a_signal_the_executor_received_too_waits_for_the_executor(tmp_path):
    code, seconds, shared = _run(tmp_path, "group")
    assert code == 0  # it worked on until its own end
    assert seconds > WORK_S / 2
    assert shared == "True"  # from the record: the handler noted nothing


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["alone", "earlier"])
def test_a_signal_to_the_worker_alone_kills_it(tmp_path, mode):
    """Also when the executor received the same signal before the worker
    started: only what its record gains afterwards counts."""
    code, seconds, shared = _run(tmp_path, mode)
    assert code == -15
    assert seconds < WORK_S / 2
    assert shared == ("False" if mode == "alone" else "True")


@pytest.mark.timeout(60)
def test_what_the_worker_starts_and_what_it_ignores_keep_their_actions(tmp_path):
    """A process the worker starts dies of SIGTERM (nothing blocked is
    inherited); SIGHUP, and a SIGTERM the worker was started ignoring, are
    left as they were (a worker under ``nohup`` keeps ignoring hangups)."""
    script = """
import os, signal, subprocess, sys
from executor.stop_signals import RECORD_FD_ENV, delivery_record
from worker.job_signals import defer_to_executor
signal.signal(signal.SIGTERM, lambda *_: None)
os.environ[RECORD_FD_ENV] = str(delivery_record())
signal.signal(signal.SIGHUP, signal.SIG_IGN)
defer_to_executor()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
child.terminate()
print(child.wait(timeout=20), signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)
os.environ[RECORD_FD_ENV] = str(delivery_record())
signal.signal(signal.SIGTERM, signal.SIG_IGN)
defer_to_executor()
print(signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
"""
    result, leftovers = run_in_session([sys.executable, "-c", script], timeout=40)
    assert result.returncode == 0 and leftovers == [], result.stderr
    assert result.stdout.split() == ["-15", "True", "True"]
