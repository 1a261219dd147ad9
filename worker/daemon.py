"""The worker daemon: one process per TP rank, driven over ZeroMQ.

Loop: receive a broadcast; ``Sync`` -> acknowledge (start-up handshake);
``ControlCall`` -> run it and reply (every rank); ``SchedulerOutput`` and
``GrammarBitmask`` -> run in ``worker.step_order``'s order (a plan's
forward pass, then its sampling: at once, or once its bitmask arrives; a
plan that comes while a bitmask is due waits for that step); only the
output rank hands the AsyncOutput to its copy thread, which sends the step's
output on the output channel (``--output``; without it, on the reply
channel). The daemon exits when told to, or when its parent process is gone
(checked once a second).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from typing import Any

import zmq

from ipc import trace
from ipc.channels import BroadcastSubscriber, ReplySender
from ipc.errors import InvalidPlanError
from ipc.messages import (
    ControlCall,
    ControlReply,
    GrammarBitmask,
    Hello,
    SchedulerOutput,
    Sync,
    WorkerError,
)
from worker.env import TorchrunEnv
from worker.fault_injection import FaultInjector
from worker.heartbeat import HeartbeatThread
from worker.output_thread import OutputCopyThread
from worker.step_order import StepOrder
from worker.worker import Worker

logger = logging.getLogger("tprun.worker")


class _Steps:
    """This rank's step messages, run in ``StepOrder``'s order: a plan's
    forward pass, its sampling (at once, or with its ``GrammarBitmask``). A
    failure of either call is reported like a rejected plan (non-fatal:
    every rank reaches the same verdict) or as a failed step (fatal)."""

    def __init__(self, worker: Worker, sender: ReplySender, output: OutputCopyThread | None,
                 heartbeat: HeartbeatThread):
        self.worker, self.sender, self.output, self.heartbeat = worker, sender, output, heartbeat
        self.rank = worker.env.rank
        self.faults = FaultInjector(self.rank)
        self.order = StepOrder(self._start, self._sample, self._reject)
        self.on_plan, self.on_bitmask = self.order.on_plan, self.order.on_bitmask

    def _start(self, plan: SchedulerOutput) -> bool:
        self.heartbeat.step_started = plan.step_id
        if trace.enabled:
            trace.mark("worker_received", plan.step_id)
        ok, _ = self._run(plan.step_id, self._forward, plan)
        return ok

    def _forward(self, plan: SchedulerOutput) -> None:
        self.faults.maybe_fail(plan.step_id)
        self.worker.execute_model(plan)

    def _sample(self, step_id: int, grammar: GrammarBitmask | None) -> None:
        ok, async_output = self._run(step_id, self.worker.sample_tokens, grammar)
        if not ok:
            return
        self.heartbeat.step_finished = step_id
        if trace.enabled:
            trace.mark("worker_sampled", step_id)
        if self.output is not None:
            self.output.put(async_output)

    def _reject(self, step_id: int, reason: str) -> None:
        logger.error("rank %d: rejected step %d: %s", self.rank, step_id, reason)
        self.sender.send(WorkerError(rank=self.rank, step_id=step_id, error=reason, fatal=False))

    def _run(self, step_id: int, call, arg) -> tuple[bool, Any]:
        """``(True, call(arg))``, or ``(False, None)`` once its failure is reported."""
        try:
            return True, call(arg)
        except InvalidPlanError as e:  # nothing applied; every rank agrees
            self._reject(step_id, str(e))
        except Exception:
            # The executor reports it, once, naming the rank at fault: a rank
            # whose collective broke because a peer died is not that rank, and
            # its own traceback would only mislead.
            error = traceback.format_exc()
            logger.debug("rank %d: step %d failed:\n%s", self.rank, step_id, error)
            self.sender.send(WorkerError(rank=self.rank, step_id=step_id, error=error))
        return False, None


def serve(worker: Worker, subscriber: BroadcastSubscriber, sender: ReplySender,
          output: OutputCopyThread | None, heartbeat: HeartbeatThread, parent_pid: int) -> None:
    rank = worker.env.rank
    steps = _Steps(worker, sender, output, heartbeat)
    while True:
        message = subscriber.recv(timeout_ms=1000)
        if message is None:
            if os.getppid() != parent_pid:
                logger.error("rank %d: parent process is gone, exiting", rank)
                os._exit(1)  # nobody to reply to: skip a cleanup that could block
            continue
        if isinstance(message, Sync):
            sender.send(Hello(rank=rank, pid=os.getpid(), sync_id=message.sync_id))
        elif isinstance(message, ControlCall):
            if message.method == "shutdown":
                sender.send(ControlReply(call_id=message.call_id, rank=rank))
                return
            try:
                result = worker.call(message.method, message.kwargs)
                sender.send(ControlReply(call_id=message.call_id, rank=rank, result=result))
            except Exception:
                error = traceback.format_exc()
                sender.send(ControlReply(call_id=message.call_id, rank=rank, error=error))
        elif isinstance(message, SchedulerOutput):
            steps.on_plan(message)
        elif isinstance(message, GrammarBitmask):
            steps.on_bitmask(message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    parser.add_argument("--broadcast", required=True, help="executor's PUB endpoint")
    parser.add_argument("--reply", required=True, help="executor's PULL endpoint")
    parser.add_argument("--output", default=None,
                        help="executor's PULL endpoint for step outputs (default: --reply)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("TPRUN_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parent_pid = int(os.environ.get("TPRUN_PARENT_PID", os.getppid()))
    env = TorchrunEnv.from_environ()
    ctx = zmq.Context()
    subscriber = BroadcastSubscriber(ctx, args.broadcast)
    sender = ReplySender(ctx, args.reply)
    sender.send(Hello(rank=env.rank, pid=os.getpid()))
    worker = Worker(env, args.device)
    output = None
    if worker.is_output_rank:
        output = OutputCopyThread(ReplySender(ctx, args.output or args.reply), env.rank)
    heartbeat = HeartbeatThread(ctx, args.reply, env.rank)
    try:
        serve(worker, subscriber, sender, output, heartbeat, parent_pid)
    finally:
        heartbeat.stop()
        if output is not None:
            output.stop()
        worker.shutdown()
        subscriber.close()
        sender.close()
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
