"""Signals that stop the whole launch (Ctrl-C, ``kill %1``), as this process saw them.

A terminal's Ctrl-C and a shell's ``kill %1`` reach every process of the
job: the executor process and its workers alike. The launcher notes each
such signal here (``note``) before it acts on it, so the executor can tell
a worker that died of the same signal (a shutdown, logged as such) from a
worker that failed, and can stop workers without waiting out a grace period
meant for a clean stop (``stopping``).

The launcher's handler runs in the main thread, and only once that thread
runs Python again: while it waits in C (a socket read, one second at a
time) a signal delivered to another thread of the process is noted late.
The delivery record (``delivery_record``) does not wait for it: CPython's
C-level handler writes each signal's number, as one byte, to the socket
given to ``signal.set_wakeup_fd`` the moment the signal arrives. The record
is only ever peeked at, never read, so every process that holds it (the
executor's workers, see ``worker/job_signals.py``) sees every byte.
Only signals with a Python handler are written: those this process acts on.

The wakeup descriptor is one per process: the record is made by the first
``delivery_record`` call (``spawn_worker``'s) only where no one holds it,
and an event loop that installs signal handlers afterwards (asyncio's
``add_signal_handler``) takes it over. The record then gains nothing, and
the workers fall back to SIGTERM's default action: a job's signal under load
ends the launch as a failure again, never a worker that outlives its job.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

# Signals a whole job receives when its user stops it.
JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# Names the inherited descriptor of the delivery record in a worker's environment.
RECORD_FD_ENV = "TPRUN_SIGNAL_RECORD_FD"

_received: list[int] = []
_event = threading.Event()
# This process's delivery record (reading end, writing end), made once.
_record: tuple[socket.socket, socket.socket] | None = None


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
    received too: noted, or in the delivery record, within ``wait_s`` (the
    kernel may run this process's handler a moment after a watcher thread
    sees the child gone)."""
    if exit_code is None or exit_code >= 0 or -exit_code not in JOB_SIGNALS:
        return False
    signum = -exit_code
    deadline = time.monotonic() + wait_s
    while signum not in _received and (_record is None or signum not in delivered(_record[0])):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def delivery_record() -> int | None:
    """The descriptor a child inherits to see the signals delivered to this
    process (``delivered``), the record made on the first call. None where
    it cannot be made: outside the main thread (``set_wakeup_fd`` is the
    main thread's), or where the wakeup descriptor is already someone
    else's (an event loop's), which is left as it was."""
    global _record
    if _record is None:
        if threading.current_thread() is not threading.main_thread():
            return None
        reader, writer = socket.socketpair()
        writer.setblocking(False)  # the C handler must never block
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        if previous != -1:
            signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            return None
        _record = (reader, writer)
    return _record[0].fileno()


def delivered(record: socket.socket) -> bytes:
    """The signals a delivery record holds so far, one byte each in the
    order they came (peeked, so left for every other reader; a record that
    is gone holds none)."""
    try:
        return record.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # nothing yet (BlockingIOError), or the record is gone
        return b""


def reset() -> None:
    """Forget noted and recorded signals: ``launch.cli.main`` does at its
    start, so each of several launches in one process judges only its own."""
    _received.clear()
    _event.clear()
    if _record is not None:
        try:
            while _record[0].recv(1 << 16, socket.MSG_DONTWAIT):
                pass
        except BlockingIOError:
            pass
