"""A job's stop signal (SIGTERM, SIGHUP) is the executor's to act on.

``systemctl stop`` (KillMode=control-group) and ``kill -TERM -PGID`` signal
every process of the launch at once. A worker that died of the signal in the
middle of a step would fail the step the engine waits for, and a server under
load would end as a failure (a dead rank) instead of the clean stop it makes
when idle. So a worker the executor spawned keeps these signals blocked, and
a thread waits for them (``sigwait``):

- the executor received the same signal (its delivery record, inherited from
  it, gains one more of it within ``CHECK_S``: executor/stop_signals.py):
  the executor stops this worker itself, with a shutdown call once the step
  in hand is done, or by its own death (the parent-death signal). The worker
  keeps serving meanwhile, for ``GRACE_S`` at most;
- otherwise this worker alone was signalled: it dies of the signal (its
  default action) after ``CHECK_S``, and the executor reports the dead rank.

A second signal while the worker waits for the executor ends it at once.
Workers without a record (started by torchrun for ``--attach-workers``)
keep the default action: their launcher decides.
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

STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP}
# How long the executor's record may lag this worker's own delivery.
CHECK_S = 0.5
# The longest a worker waits for an executor that received the signal too.
GRACE_S = 30.0


def defer_to_executor() -> None:
    """Hold SIGTERM and SIGHUP for the executor when it passed its record.

    Call in the main thread before any other thread starts: threads inherit
    the main thread's mask, and a signal must be blocked in every thread for
    ``sigwait`` alone to take it."""
    fd = os.environ.pop(RECORD_FD_ENV, None)  # this process's, not its children's
    rank = int(os.environ.get("RANK", "0"))
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)  # what ``_die_of`` relies on
    if not fd:
        return
    try:
        record = socket.socket(fileno=int(fd))
    except (OSError, ValueError):  # not the executor's record: nothing to defer to
        logger.warning("rank %d: %s=%s names no record: SIGTERM keeps its default action",
                       rank, RECORD_FD_ENV, fd)
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    # Only what the record gains from now on counts: a signal the executor
    # received earlier (and lived on after) says nothing of this worker's.
    seen = delivered(record)
    threading.Thread(target=_wait, args=(record, seen, rank), name="job-signals",
                     daemon=True).start()


def _wait(record: socket.socket, seen: bytes, rank: int) -> None:
    """Take the first stop signal; live on while the executor stops this
    worker if the executor received it too, else die of it."""
    signum = signal.sigwait(STOP_SIGNALS)
    if _executor_received(record, signum, seen.count(signum)):
        name = signal.Signals(signum).name
        logger.info("rank %d: %s reached the executor too: serving until it stops this worker",
                    rank, name)
        again = signal.sigtimedwait(STOP_SIGNALS, GRACE_S)
        if again is None:
            logger.warning("rank %d: not stopped %g s after %s: exiting", rank, GRACE_S, name)
        else:
            signum = again.si_signo
    _die_of(signum)


def _executor_received(record: socket.socket, signum: int, before: int) -> bool:
    """The record holds more than ``before`` of ``signum`` within ``CHECK_S``
    (a group's signal reaches its processes one after another)."""
    deadline = time.monotonic() + CHECK_S
    while delivered(record).count(signum) <= before:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _die_of(signum: int) -> None:
    """End the process as ``signum``'s default action does, so the executor
    sees a worker killed by it: unblocked in this thread alone, the signal
    sent to this thread is delivered here."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    signal.pthread_kill(threading.get_ident(), signum)
    os._exit(128 + signum)  # only if a handler replaced the default action meanwhile
