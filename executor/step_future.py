"""A step's output future that its waiter settles by reading the socket.

``StepFuture.result`` does not sleep on a condition for another thread to
set it: the waiting thread reads the output channel itself
(``OutputPump.wait``) and settles every step whose reply it reads, its own
or an earlier one. Between the output rank's send and the waiter's return
there is then one wake-up (the socket's), where a reader thread that sets
the future makes two (the reader's, then the waiter's) and hands the GIL
over once more.

Whatever else settles a step (the reply channel's reader: a rank's error, a
dead worker, an output that came on the reply channel) nudges the pump,
which then finds the future done. A future settled before ``result`` is
called returns at once, without touching the socket.

Invariants: one thread at a time reads the socket (the pump's lock: a full
memory barrier, which ZeroMQ asks of a socket that changes threads); a
blocked read lasts at most ``SLICE_MS``, so a nudge that was somehow lost
costs that long, never a hang; ``timeout`` bounds the wait as it does for
``concurrent.futures.Future.result``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from ipc.channels import OutputReceiver
from ipc.messages import Reply

SLICE_MS = 1000


class OutputPump:
    """Reads ``receiver`` for the thread that waits for a step and hands
    each reply to ``on_reply`` (which settles the step it names)."""

    def __init__(self, receiver: OutputReceiver, on_reply: Callable[[Reply], None]):
        self.receiver = receiver
        self.on_reply = on_reply
        self.lock = threading.Lock()

    def wait(self, future: Future, timeout: float | None) -> None:
        """Read until ``future`` is done; ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while not future.done():
                slice_ms = SLICE_MS
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"no step output within {timeout} s")
                    slice_ms = min(slice_ms, math.ceil(left * 1000))
                reply = self.receiver.recv(timeout_ms=slice_ms)
                if reply is not None:
                    self.on_reply(reply)


class StepFuture(Future):
    """A ``Future`` whose ``result`` pumps the output channel while it waits."""

    def __init__(self, pump: OutputPump):
        super().__init__()
        self.pump = pump

    def result(self, timeout: float | None = None):
        if not self.done():
            self.pump.wait(self, timeout)
        return super().result(timeout=0)
