"""A worker's heartbeat: twice a second, the last step started and finished.

Runs in its own thread with its own PUSH socket, so it keeps beating while
the main thread is busy (or stuck) in a step: the executor can then name the
ranks that have not finished a step in time.
"""

from __future__ import annotations

import threading

import zmq

from ipc.channels import ReplySender
from ipc.messages import Heartbeat

INTERVAL_S = 0.5


class HeartbeatThread:
    def __init__(self, ctx: zmq.Context, endpoint: str, rank: int):
        self.rank = rank
        self.step_started = -1
        self.step_finished = -1
        self._stop = threading.Event()
        self._sender = ReplySender(ctx, endpoint)
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._sender.send(Heartbeat(rank=self.rank, step_started=self.step_started,
                                        step_finished=self.step_finished))
        self._sender.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
