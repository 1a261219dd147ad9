"""The output rank's copy thread: waits on each AsyncOutput and replies.

This is the only place a worker waits for the device. Other ranks never
start it. It owns its own PUSH socket (ZeroMQ sockets are per thread).
"""

from __future__ import annotations

import queue
import threading
import traceback

from ipc import trace
from ipc.channels import ReplySender
from ipc.messages import WorkerError


class OutputCopyThread:
    def __init__(self, sender: ReplySender, rank: int):
        self.sender = sender
        self.rank = rank
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="output-copy", daemon=True)
        self.thread.start()

    def put(self, async_output) -> None:
        self.queue.put(async_output)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                output = item.get_output()
                if trace.enabled:
                    trace.mark("worker_output_sent", item.step_id)
                self.sender.send(output)
            except Exception:
                error = traceback.format_exc()
                self.sender.send(WorkerError(rank=self.rank, step_id=item.step_id, error=error))

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)
        self.sender.close()
