"""Worker daemons over ZeroMQ: one process per TP rank.

The executor binds a PUB socket (steps and control calls, encoded once) and
a PULL socket (replies). A reader thread owns the PULL socket: it resolves
step futures from the output rank's replies and control futures once every
rank has answered, and it watches the worker processes: a dead worker fails
every pending future at once with an error naming its rank and exit code.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

import zmq

from executor.base import Executor, WorkerFailure
from ipc.channels import BroadcastPublisher, ReplyReceiver, wait_for_subscribers
from ipc.endpoints import Endpoints
from ipc.messages import ControlCall, ControlReply, ModelRunnerOutput, SchedulerOutput, WorkerError

logger = logging.getLogger(__name__)

_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class MultiprocExecutor(Executor):
    def __init__(self, world_size: int, device: str, master_addr: str = "127.0.0.1",
                 master_port: int | None = None, start_timeout_s: float = 120.0):
        self.world_size = world_size
        self.endpoints = Endpoints.create()
        self.ctx = zmq.Context()
        self.publisher = BroadcastPublisher(self.ctx, self.endpoints.broadcast)
        self.receiver = ReplyReceiver(self.ctx, self.endpoints.reply)
        self.lock = threading.Lock()
        self.step_futures: dict[int, Future] = {}
        self.control_futures: dict[int, tuple[Future, dict[int, Any]]] = {}
        self.call_ids = itertools.count()
        self.failure: WorkerFailure | None = None
        self.closing = False
        port = master_port or free_port(master_addr)
        self.procs = [self._spawn(r, device, master_addr, port) for r in range(world_size)]
        try:
            wait_for_subscribers(self.publisher, self.receiver, world_size,
                                 start_timeout_s, self._raise_if_dead)
        except BaseException:
            self.shutdown()
            raise
        self.reader = threading.Thread(target=self._read_replies, name="replies", daemon=True)
        self.reader.start()

    def _spawn(self, rank: int, device: str, addr: str, port: int) -> subprocess.Popen:
        env = dict(os.environ)
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.world_size),
                   LOCAL_WORLD_SIZE=str(self.world_size), MASTER_ADDR=addr, MASTER_PORT=str(port))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "worker", "--broadcast", self.endpoints.broadcast,
               "--reply", self.endpoints.reply, "--device", device]
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)

    # ---- failure detection ---------------------------------------------
    def _dead_worker(self) -> WorkerFailure | None:
        for rank, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None:
                return WorkerFailure(f"worker rank {rank} (pid {proc.pid}) exited with code {code}")
        return None

    def _raise_if_dead(self) -> None:
        if (failure := self._dead_worker()) is not None:
            raise failure

    def _fail_all(self, failure: WorkerFailure) -> None:
        with self.lock:
            self.failure = failure
            futures = list(self.step_futures.values())
            futures += [f for f, _ in self.control_futures.values()]
            self.step_futures.clear()
            self.control_futures.clear()
        for future in futures:
            if not future.done():
                future.set_exception(failure)

    # ---- the reader thread ---------------------------------------------
    def _read_replies(self) -> None:
        while not self.closing:
            reply = self.receiver.recv(timeout_ms=100)
            if reply is None:
                if not self.closing and (failure := self._dead_worker()) is not None:
                    logger.error("%s", failure)
                    self._fail_all(failure)
                    return
                continue
            if isinstance(reply, ModelRunnerOutput):
                with self.lock:
                    future = self.step_futures.pop(reply.step_id, None)
                if future is not None:
                    future.set_result(reply)
            elif isinstance(reply, ControlReply):
                self._on_control_reply(reply)
            elif isinstance(reply, WorkerError):
                failure = WorkerFailure(
                    f"worker rank {reply.rank} failed step {reply.step_id}:\n{reply.error}"
                )
                logger.error("%s", failure)
                self._fail_all(failure)

    def _on_control_reply(self, reply: ControlReply) -> None:
        with self.lock:
            entry = self.control_futures.get(reply.call_id)
            if entry is None:
                return
            future, results = entry
            if reply.error is not None:
                del self.control_futures[reply.call_id]
            else:
                results[reply.rank] = reply.result
                if len(results) < self.world_size:
                    return
                del self.control_futures[reply.call_id]
        if reply.error is not None:
            future.set_exception(WorkerFailure(f"worker rank {reply.rank}:\n{reply.error}"))
        else:
            future.set_result([results[r] for r in range(self.world_size)])

    # ---- the interface -------------------------------------------------
    def _register(self, table: dict, key: int, value) -> None:
        with self.lock:
            if self.failure is not None:
                raise self.failure
            table[key] = value

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None,
                       timeout: float = 300.0) -> list[Any]:
        call_id = next(self.call_ids)
        future: Future = Future()
        self._register(self.control_futures, call_id, (future, {}))
        self.publisher.publish(ControlCall(call_id=call_id, method=method, kwargs=kwargs or {}))
        return future.result(timeout=timeout)

    def execute_model(self, plan: SchedulerOutput) -> Future:
        future: Future = Future()
        self._register(self.step_futures, plan.step_id, future)
        self.publisher.publish(plan)
        return future

    def shutdown(self) -> None:
        if self.closing:
            return
        self.closing = True
        if getattr(self, "reader", None) is not None:
            self.reader.join(timeout=2)
        try:
            self.publisher.publish(ControlCall(call_id=-1, method="shutdown"))
        except zmq.ZMQError:
            pass
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.publisher.close()
        self.receiver.close()
        self.ctx.term()
        self.endpoints.cleanup()
