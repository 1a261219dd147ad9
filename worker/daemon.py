"""The worker daemon: one process per TP rank, driven over ZeroMQ.

Loop: receive a broadcast; ``Sync`` -> acknowledge (start-up handshake);
``ControlCall`` -> run it and reply (every rank); ``SchedulerOutput`` ->
run the step; only the output rank hands the AsyncOutput to its copy
thread, which replies. The daemon exits when told to, or when its parent
process is gone (checked once a second).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

import zmq

from ipc.channels import BroadcastSubscriber, ReplySender
from ipc.errors import InvalidPlanError
from ipc.messages import ControlCall, ControlReply, Hello, SchedulerOutput, Sync, WorkerError
from worker.env import TorchrunEnv
from worker.fault_injection import FaultInjector
from worker.heartbeat import HeartbeatThread
from worker.output_thread import OutputCopyThread
from worker.worker import Worker

logger = logging.getLogger("tprun.worker")


def serve(worker: Worker, subscriber: BroadcastSubscriber, sender: ReplySender,
          output: OutputCopyThread | None, heartbeat: HeartbeatThread, parent_pid: int) -> None:
    rank = worker.env.rank
    faults = FaultInjector(rank)
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
            heartbeat.step_started = message.step_id
            try:
                faults.maybe_fail(message.step_id)
                async_output = worker.execute(message)
            except InvalidPlanError as e:  # nothing applied; every rank agrees
                logger.error("rank %d: rejected step %d: %s", rank, message.step_id, e)
                sender.send(WorkerError(rank=rank, step_id=message.step_id, error=str(e),
                                        fatal=False))
                continue
            except Exception:
                error = traceback.format_exc()
                logger.error("rank %d: step %d failed:\n%s", rank, message.step_id, error)
                sender.send(WorkerError(rank=rank, step_id=message.step_id, error=error))
                continue
            heartbeat.step_finished = message.step_id
            if output is not None:
                output.put(async_output)


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
