"""Signals that stop the whole launch (Ctrl-C, ``kill %1``), as this process saw them.

A terminal's Ctrl-C and a shell's ``kill %1`` reach every process of the
job: the executor process and its workers alike. The launcher notes each
such signal here (``note``) before it acts on it, so the executor can tell
a worker that died of the same signal (a shutdown, logged as such) from a
worker that failed, and can stop workers without waiting out a grace period
meant for a clean stop (``stopping``).
"""

from __future__ import annotations

import signal
import threading

# Signals a whole job receives when its user stops it.
JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_received: list[int] = []
_event = threading.Event()


def note(signum: int) -> None:
    """This process received ``signum`` (signal-handler safe)."""
    if signum not in _received:
        _received.append(signum)
    _event.set()


def stopping() -> bool:
    """A job signal has been noted: the launch is being stopped."""
    return _event.is_set()


def first() -> int | None:
    """The first signal noted, if any."""
    return _received[0] if _received else None


def shared_with_parent(exit_code: int | None, wait_s: float = 0.5) -> bool:
    """A child that ended with ``exit_code`` died of a job signal this process
    received too (noted within ``wait_s``: the handler in the main thread may
    run a moment after a watcher thread sees the child gone)."""
    if exit_code is None or exit_code >= 0 or -exit_code not in JOB_SIGNALS:
        return False
    _event.wait(wait_s)
    return -exit_code in _received


def reset() -> None:
    """Forget noted signals (tests running several launches in one process)."""
    _received.clear()
    _event.clear()
