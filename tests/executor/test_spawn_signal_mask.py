"""A worker starts with SIGINT blocked, and the executor's own mask is unchanged.

A job's Ctrl-C reaches every process of the job; one that lands while a
worker's interpreter is still starting (its site import, before
``worker/__main__.py`` can ignore SIGINT) would kill it with a traceback.
``spawn_worker`` creates the child with SIGINT blocked (the mask survives
fork and exec), so the signal waits until the worker has chosen to ignore it.
"""

from __future__ import annotations

import os
import signal
import sys

from executor.multiproc import spawn_worker


def _spawn_and_read(tmp_path, source: str) -> str:
    """Run ``source`` as a module spawned as the executor spawns workers; what
    it wrote to the file named by its first argument."""
    (tmp_path / "probe_child.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    out = tmp_path / "out"
    proc = spawn_worker("probe_child", [str(out)], env)
    assert proc.wait(timeout=60) == 0
    return out.read_text()


def _blocked_in_child(tmp_path) -> set[int]:
    """The signals blocked in a spawned child."""
    written = _spawn_and_read(
        tmp_path,
        "import signal, sys\n"
        "blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])\n"
        "open(sys.argv[1], 'w').write(' '.join(str(int(s)) for s in blocked))\n")
    return {int(s) for s in written.split()}


def test_a_spawned_worker_starts_with_sigint_blocked(tmp_path):
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.SIGINT not in before
    assert signal.SIGINT in _blocked_in_child(tmp_path)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_a_ctrl_c_pending_at_start_up_is_dropped_once_ignored(tmp_path):
    """What ``python -m worker`` does first: ignore SIGINT, then unblock it.
    A SIGINT sent while it was blocked is then discarded, not delivered."""
    written = _spawn_and_read(
        tmp_path,
        "import os, signal, sys, time\n"
        "os.kill(os.getpid(), signal.SIGINT)  # pending: blocked since the spawn\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"
        "time.sleep(0.1)\n"
        "open(sys.argv[1], 'w').write('alive')\n")
    assert written == "alive"
