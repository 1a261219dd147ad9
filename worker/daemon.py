"""The worker daemon: one process per TP rank, driven over ZeroMQ.

Loop: receive a broadcast; ``Sync`` -> acknowledge (start-up handshake);
``ControlCall`` -> run it and reply (every rank); ``SchedulerOutput`` ->
run the step's forward pass, and sample it (at once, or when its
``GrammarBitmask`` arrives); only the output rank hands the AsyncOutput to
its copy thread, which replies. The daemon exits when told to, or when its
parent process is gone (checked once a second).
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
from worker.worker import Worker

logger = logging.getLogger("tprun.worker")


class _Steps:
    """The step messages of one rank: a plan runs its forward pass at once;
    it samples at once too, unless it has constrained requests, in which
    case the rank waits for the step's ``GrammarBitmask`` (the next step
    message the executor sends). A failure of either call is reported like a
    rejected plan (non-fatal: every rank reaches the same verdict) or as a
    failed step (fatal)."""

    def __init__(self, worker: Worker, sender: ReplySender, output: OutputCopyThread | None,
                 heartbeat: HeartbeatThread):
        self.worker, self.sender, self.output, self.heartbeat = worker, sender, output, heartbeat
        self.rank = worker.env.rank
        self.faults = FaultInjector(self.rank)
        self.awaiting: int | None = None  # the step that waits for its bitmask

    def on_plan(self, plan: SchedulerOutput) -> None:
        self._abandon(f"step {plan.step_id} came before its grammar bitmask")
        self.heartbeat.step_started = plan.step_id
        if trace.enabled:
            trace.mark("worker_received", plan.step_id)
        ok, _ = self._run(plan.step_id, self._forward, plan)
        if not ok:
            return
        if plan.structured_output_req_ids:
            self.awaiting = plan.step_id
        else:
            self._sample(plan.step_id, None)

    def on_bitmask(self, grammar: GrammarBitmask) -> None:
        if self.awaiting != grammar.step_id:
            self._reject(grammar.step_id, "no step waits for this grammar bitmask")
            return
        self.awaiting = None
        self._sample(grammar.step_id, grammar)

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

    def _abandon(self, reason: str) -> None:
        if self.awaiting is not None:
            self._reject(self.awaiting, reason)
            self.awaiting = None

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
            error = traceback.format_exc()
            logger.error("rank %d: step %d failed:\n%s", self.rank, step_id, error)
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
    output = OutputCopyThread(ReplySender(ctx, args.reply), env.rank) if worker.is_output_rank else None
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
