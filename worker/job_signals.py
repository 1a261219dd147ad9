"""A job's SIGTERM is the executor's to act on.

``systemctl stop`` (KillMode=control-group) and ``kill -TERM -PGID`` signal
every process of the launch at once. A worker that died of the signal in the
middle of a step would fail the step the engine waits for, and a server under
load would end as a failure (a dead rank) instead of the clean stop it makes
when idle. So a worker the executor spawned handles SIGTERM itself: the
handler (main thread) puts the default action back, so that a second SIGTERM
ends the worker at once, and leaves the decision to a thread:

- the executor received the same signal (its delivery record, inherited from
  it, gains one more SIGTERM within ``CHECK_S``: executor/stop_signals.py):
  the executor stops this worker itself, with a shutdown call once the step
  in hand is done, or by its own death (the parent-death signal). The worker
  keeps serving meanwhile, for ``GRACE_S`` at most;
- otherwise this worker alone was signalled: it dies of the signal after
  ``CHECK_S``, and the executor reports the dead rank.

A handler, not a blocked signal: processes the worker starts (compilers,
compile workers) get SIGTERM's default action back when they exec, where a
blocked mask would be inherited. SIGHUP is left as the worker found it (the
launcher handles no SIGHUP, so none is the executor's to act on; a worker
started under ``nohup`` keeps ignoring it), and so is a SIGTERM the worker
was started ignoring. Workers without a record (started by torchrun for
``--attach-workers``) keep SIGTERM's default action: their launcher decides.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

from executor.stop_signals import RECORD_FD_ENV, delivered

logger = logging.getLogger(__name__)

# How long the executor's record may lag this worker's own delivery.
CHECK_S = 0.5
# The longest a worker waits for an executor that received the signal too.
GRACE_S = 30.0


def defer_to_executor() -> None:
    """Handle SIGTERM as the module says when the executor passed its
    record (call in the main thread: handlers are the main thread's)."""
    fd = os.environ.pop(RECORD_FD_ENV, None)  # this process's, not its children's
    if not fd or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        return
    rank = int(os.environ.get("RANK", "0"))
    try:
        record = socket.socket(fileno=int(fd))
    except (OSError, ValueError):  # not the executor's record: nothing to defer to
        logger.warning("rank %d: %s=%s names no record: SIGTERM keeps its default action",
                       rank, RECORD_FD_ENV, fd)
        return
    # Only what the record gains from now on counts: a signal the executor
    # received earlier (and lived on after) says nothing of this worker's.
    seen = delivered(record).count(signal.SIGTERM)

    def on_sigterm(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the worker
        threading.Thread(target=_decide, args=(record, seen, rank), name="job-signals",
                         daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)


def _decide(record: socket.socket, seen: int, rank: int) -> None:
    """Live on while the executor stops this worker if the executor
    received the SIGTERM too (for ``GRACE_S`` at most), else die of it."""
    if _executor_received(record, seen):
        logger.info("rank %d: SIGTERM reached the executor too: serving until it stops "
                    "this worker", rank)
        time.sleep(GRACE_S)
        logger.warning("rank %d: not stopped %g s after SIGTERM: exiting", rank, GRACE_S)
    os.kill(os.getpid(), signal.SIGTERM)  # the default action is back: the worker dies of it


def _executor_received(record: socket.socket, before: int) -> bool:
    """The record holds more than ``before`` SIGTERMs within ``CHECK_S`` (a
    group's signal reaches its processes one after another)."""
    deadline = time.monotonic() + CHECK_S
    while delivered(record).count(signal.SIGTERM) <= before:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True
