"""Benchmark tprun's IPC round trip against bare pyzmq with the same bytes.

    python -m benchmarks.bench_ipc [--tp 1 2 4 8] [--iters N] [--out FILE]
                                   [--transport ipc tcp] [--warmup W] [--rounds R]

For each transport and TP size N it starts N worker processes (no model) and
times one step's round trip as the executor sees it:

  ipc:  BroadcastPublisher.publish(SchedulerOutput)  (msgspec encode included)
        -> every worker: BroadcastSubscriber.recv (decode)
        -> rank 0 only: ReplySender.send(ModelRunnerOutput of 256 tokens)
        -> ReplyReceiver.recv (decode); stop the clock.
  bare: raw PUB.send(the same encoded plan bytes) -> every worker: SUB.recv()
        -> rank 0 only: PUSH.send(the same encoded reply bytes) -> PULL.recv().

The plan is a decode step of 256 cached requests ("req-<n>", one token each, a
new KV block for those crossing a block boundary); step_id changes every
iteration. Workers start as the executor starts its worker daemons
(executor/multiproc.py: ``spawn_worker`` with the same environment, here
running ``python -m benchmarks.bench_ipc --worker``) and go through the real
handshake (wait_for_subscribers). Both modes use the same processes, in alternating
blocks, so drift on a busy host falls on both alike; warm-up iterations are
left out. The rank 0 reply is sent from the worker's main loop (the real
daemon hands it to a copy thread; that hand-off is not measured here).

Also measured, in process: the msgspec encode/decode times of both messages,
to show where any protocol overhead goes, and of the engine's ``Outputs`` to
its client after such a step (one delta a request).

Prints a table, then, last, one JSON object with all results.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import statistics
import subprocess
import sys
import time

import msgspec
import zmq

from benchmarks.common import emit_summary
from executor.multiproc import exited_worker, spawn_worker, stop_workers, worker_environ
from ipc.channels import (
    BroadcastPublisher,
    BroadcastSubscriber,
    ReplyReceiver,
    ReplySender,
    wait_for_subscribers,
)
from ipc.endpoints import Endpoints
from ipc.engine_messages import Delta, Outputs, decode_server_message
from ipc.messages import (
    CachedRequestData,
    ControlCall,
    ControlReply,
    Hello,
    ModelRunnerOutput,
    SchedulerOutput,
    Sync,
)
from ipc.serde import decode_broadcast, decode_reply, encode
from worker.env import TorchrunEnv
from worker.parent_death import die_with_parent_from_env

BLOCK_SIZE = 16
TARGET_TP = 8
TARGET_RATIO = 1.2
REPLY_TIMEOUT_MS = 10_000
POLL_MS = 1000  # how often an idle worker checks that its parent is alive

# Bare-mode control frames (one byte; a plan is always longer). A worker
# acknowledges each with two bytes: its rank, then the frame.
SYNC, BARRIER, TO_IPC, QUIT = b"S", b"B", b"I", b"Q"


# ---- the messages ----------------------------------------------------------
def make_plan(num_reqs: int, step_id: int = 0) -> SchedulerOutput:
    """A decode step: ``num_reqs`` cached requests, one token each."""
    rng = random.Random(0)
    req_ids = [f"req-{1000 + i}" for i in range(num_reqs)]
    computed = [rng.randrange(16, 4096) for _ in range(num_reqs)]
    # A request whose next token starts a new block gets one (about 1 in 16).
    new_blocks = [[[rng.randrange(60_000)]] if n % BLOCK_SIZE == 0 else None for n in computed]
    cached = CachedRequestData(req_ids=req_ids, new_block_ids=new_blocks)
    return SchedulerOutput(step_id=step_id, scheduled_cached_reqs=cached,
                           num_scheduled_tokens=[1] * num_reqs)


def sampled_tokens(num_reqs: int) -> list[int]:
    rng = random.Random(1)
    return [rng.randrange(128_256) for _ in range(num_reqs)]


def make_reply(plan: SchedulerOutput, sampled: list[int]) -> ModelRunnerOutput:
    """One token per request, in the plan's order (the decode-step reply)."""
    return ModelRunnerOutput(step_id=plan.step_id, sampled_token_ids=sampled)


def make_outputs(plan: SchedulerOutput, sampled: list[int]) -> Outputs:
    """What the engine sends its client after that step: one delta a
    request, one token and a short text each, nothing else set."""
    return Outputs(deltas=[Delta(request_id=req_id, token_ids=[token], text=" tok",
                                 finished=False)
                           for req_id, token in zip(plan.scheduled_req_ids(), sampled)])


# ---- the worker process -----------------------------------------------------
def serve_ipc(rank: int, subscriber: BroadcastSubscriber, sender: ReplySender,
              sampled: list[int], parent_pid: int) -> str:
    """What a worker daemon does with the broadcast; returns the next mode."""
    while True:
        message = subscriber.recv(timeout_ms=POLL_MS)
        if message is None:
            if os.getppid() != parent_pid:
                return "quit"
            continue
        if isinstance(message, SchedulerOutput):
            if rank == 0:  # the output rank replies; the others do nothing
                sender.send(make_reply(message, sampled))
        elif isinstance(message, Sync):
            sender.send(Hello(rank=rank, pid=os.getpid(), sync_id=message.sync_id))
        elif isinstance(message, ControlCall):
            sender.send(ControlReply(call_id=message.call_id, rank=rank))
            return message.method


def serve_bare(rank: int, sub: zmq.Socket, push: zmq.Socket, reply_bytes: bytes,
               parent_pid: int) -> str:
    """Receive raw frames; rank 0 answers each plan with the reply bytes."""
    me = bytes([rank])
    while True:
        try:
            data = sub.recv()
        except zmq.Again:
            if os.getppid() != parent_pid:
                return "quit"
            continue
        if len(data) > 1:
            if rank == 0:
                push.send(reply_bytes)
            continue
        push.send(me + data)
        if data == TO_IPC:
            return "ipc"
        if data == QUIT:
            return "quit"


def worker_main(argv: list[str]) -> int:
    """One worker, started by ``Cluster`` with the executor's worker
    environment: its rank is RANK, and it dies with the benchmark."""
    die_with_parent_from_env()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_ipc --worker")
    parser.add_argument("--num-reqs", type=int, required=True)
    parser.add_argument("--endpoints", nargs=4, required=True,
                        metavar=("BROADCAST", "REPLY", "RAW_PUB", "RAW_PULL"))
    args = parser.parse_args(argv)
    broadcast, reply, raw_pub, raw_pull = args.endpoints
    rank = TorchrunEnv.from_environ().rank
    parent_pid = os.getppid()
    sampled = sampled_tokens(args.num_reqs)
    reply_bytes = encode(make_reply(make_plan(args.num_reqs), sampled))
    ctx = zmq.Context()
    subscriber = BroadcastSubscriber(ctx, broadcast)
    sender = ReplySender(ctx, reply)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVTIMEO, POLL_MS)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(raw_pub)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(raw_pull)
    sender.send(Hello(rank=rank, pid=os.getpid()))
    mode = "ipc"
    try:
        while mode != "quit":
            if mode == "ipc":
                mode = serve_ipc(rank, subscriber, sender, sampled, parent_pid)
            else:
                mode = serve_bare(rank, sub, push, reply_bytes, parent_pid)
    finally:
        for socket in (subscriber, sender, sub, push):
            socket.close()
        ctx.term()
    return 0


# ---- the executor side ------------------------------------------------------
class Cluster:
    """N worker processes and the executor's sockets of both kinds.

    Workers start in ipc mode; ``to_bare``/``to_ipc`` switch every worker and
    return once all have acknowledged, after which no stale message is left
    on either reply socket (each worker's pipe is FIFO and the barrier reads
    it through the acknowledgement).
    """

    def __init__(self, tp: int, transport: str, num_reqs: int, start_timeout_s: float):
        self.tp = tp
        self.raw_synced = False
        self.call_ids = 0
        self.procs: list[subprocess.Popen] = []
        self.endpoints = Endpoints.create()
        self.ctx = zmq.Context()
        self.sockets: list = []
        try:
            self._bind(transport)
            self.procs = [self._spawn(rank, num_reqs) for rank in range(tp)]
            wait_for_subscribers(self.publisher, self.receiver, tp, start_timeout_s,
                                 self.raise_if_dead)
        except BaseException:
            self.close()
            raise

    def _endpoint(self, transport: str, name: str) -> str:
        if transport == "ipc":
            return f"ipc://{self.endpoints.directory}/{name}"
        return "tcp://127.0.0.1:*"

    def _bind(self, transport: str) -> None:
        self.publisher = BroadcastPublisher(self.ctx, self._endpoint(transport, "broadcast"))
        self.sockets.append(self.publisher)
        self.receiver = ReplyReceiver(self.ctx, self._endpoint(transport, "reply"))
        self.sockets.append(self.receiver)
        self.pub = self.ctx.socket(zmq.PUB)
        self.sockets.append(self.pub)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(self._endpoint(transport, "raw-broadcast"))
        self.pull = self.ctx.socket(zmq.PULL)
        self.sockets.append(self.pull)
        self.pull.setsockopt(zmq.RCVHWM, 0)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
        self.pull.bind(self._endpoint(transport, "raw-reply"))

    def _spawn(self, rank: int, num_reqs: int) -> subprocess.Popen:
        addresses = [s.getsockopt(zmq.LAST_ENDPOINT).decode() for s in
                     (self.publisher.socket, self.receiver.socket, self.pub, self.pull)]
        env = worker_environ(rank, self.tp, "127.0.0.1", 0)  # no process group: no port
        return spawn_worker("benchmarks.bench_ipc", ["--worker", "--num-reqs", str(num_reqs),
                                                     "--endpoints", *addresses], env)

    def raise_if_dead(self) -> None:
        if (failure := exited_worker(self.procs)) is not None:
            raise failure

    # ---- one round trip each ----------------------------------------------
    def ipc_round_trip(self, plan: SchedulerOutput) -> int:
        """Nanoseconds from publish start to the matching reply decoded."""
        start = time.perf_counter_ns()
        self.publisher.publish(plan)
        while True:
            reply = self.receiver.recv(timeout_ms=REPLY_TIMEOUT_MS)
            if isinstance(reply, ModelRunnerOutput) and reply.step_id == plan.step_id:
                return time.perf_counter_ns() - start
            if reply is None:
                self.raise_if_dead()
                raise TimeoutError(f"no reply to step {plan.step_id}")

    def bare_round_trip(self, plan_bytes: bytes) -> int:
        start = time.perf_counter_ns()
        self.pub.send(plan_bytes)
        try:
            self.pull.recv()
        except zmq.Again:
            self.raise_if_dead()
            raise TimeoutError("no bare reply") from None
        return time.perf_counter_ns() - start

    # ---- mode switches -----------------------------------------------------
    def to_bare(self) -> None:
        self._control("bare")
        if not self.raw_synced:
            self._raw_handshake()
        self._raw_barrier(BARRIER)  # also flushes surplus SYNC acknowledgements

    def _raw_handshake(self) -> None:
        """Publish SYNC until every rank acknowledged one (raw subscriptions up)."""
        synced: set[int] = set()
        deadline = time.monotonic() + REPLY_TIMEOUT_MS / 1000
        while len(synced) < self.tp:
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw subscribers {sorted(set(range(self.tp)) - synced)}")
            self.raise_if_dead()
            self.pub.send(SYNC)
            end = time.monotonic() + 0.05
            while len(synced) < self.tp and (left := end - time.monotonic()) > 0:
                if self.pull.poll(int(left * 1000) + 1) and (ack := self.pull.recv())[1:] == SYNC:
                    synced.add(ack[0])
        self.raw_synced = True

    def to_ipc(self) -> None:
        self._raw_barrier(TO_IPC)

    def _control(self, method: str) -> None:
        self.call_ids += 1
        self.publisher.publish(ControlCall(call_id=self.call_ids, method=method))
        acked: set[int] = set()
        deadline = time.monotonic() + REPLY_TIMEOUT_MS / 1000
        while len(acked) < self.tp:
            self._check(deadline, f"control call {method!r}")
            reply = self.receiver.recv(timeout_ms=100)
            if isinstance(reply, ControlReply) and reply.call_id == self.call_ids:
                acked.add(reply.rank)

    def _raw_barrier(self, frame: bytes) -> None:
        self.pub.send(frame)
        acked: set[int] = set()
        deadline = time.monotonic() + REPLY_TIMEOUT_MS / 1000
        while len(acked) < self.tp:
            self._check(deadline, f"raw frame {frame!r}")
            if self.pull.poll(100):
                ack = self.pull.recv()
                if ack[1:] == frame:
                    acked.add(ack[0])

    def _check(self, deadline: float, what: str) -> None:
        self.raise_if_dead()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not acknowledged by every rank")

    # ---- shutdown ------------------------------------------------------------
    def close(self) -> None:
        """Ask the workers to quit, then terminate and kill what is left."""
        try:
            if any(p.poll() is None for p in self.procs):  # each worker sees one of the two
                self.publisher.publish(ControlCall(call_id=-1, method="quit"))
                self.pub.send(QUIT)
        except zmq.ZMQError:
            pass
        finally:
            stop_workers(self.procs, timeout_s=5.0)
            for socket in self.sockets:
                socket.close()
            self.ctx.term()
            for name in ("raw-broadcast", "raw-reply"):  # Endpoints knows only its own two
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.endpoints.directory, name))
            self.endpoints.cleanup()


# ---- measurement ------------------------------------------------------------
def summarize(ns: list[int]) -> dict[str, float]:
    us = [x / 1000 for x in ns]
    cuts = statistics.quantiles(us, n=100, method="inclusive")
    return {"median": round(statistics.median(us), 1), "p90": round(cuts[89], 1),
            "p99": round(cuts[98], 1), "mean": round(statistics.fmean(us), 1),
            "n": len(us)}


def measure(tp: int, transport: str, args, template: SchedulerOutput) -> dict:
    """Alternating blocks of bare and ipc round trips on one set of workers."""
    plan_bytes = encode(template)
    step = iter(range(1, 1 << 62))

    def ipc_block(count: int) -> list[int]:
        plans = [msgspec.structs.replace(template, step_id=next(step)) for _ in range(count)]
        return [cluster.ipc_round_trip(plan) for plan in plans]

    def bare_block(count: int) -> list[int]:
        return [cluster.bare_round_trip(plan_bytes) for _ in range(count)]

    per_round = max(1, args.iters // args.rounds)
    block_warmup = min(10, args.warmup)
    times: dict[str, list[int]] = {"ipc": [], "bare": []}
    cluster = Cluster(tp, transport, args.num_reqs, args.start_timeout)
    try:
        ipc_block(args.warmup)
        cluster.to_bare()
        bare_block(args.warmup)
        for r in range(args.rounds):
            bare_block(block_warmup)
            times["bare"] += bare_block(per_round)
            cluster.to_ipc()
            ipc_block(block_warmup)
            times["ipc"] += ipc_block(per_round)
            if r + 1 < args.rounds:
                cluster.to_bare()
    finally:
        cluster.close()
    ipc, bare = summarize(times["ipc"]), summarize(times["bare"])
    return {"transport": transport, "tp": tp, "ipc_us": ipc, "bare_us": bare,
            "ratio_median": round(ipc["median"] / bare["median"], 3),
            "ratio_p99": round(ipc["p99"] / bare["p99"], 3)}


def time_call_us(fn, arg, reps: int) -> float:
    """Median of ``reps`` timings of fn(arg), in microseconds."""
    samples = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn(arg)
        samples.append(time.perf_counter_ns() - start)
    return round(statistics.median(samples) / 1000, 2)


def serde_breakdown(plan: SchedulerOutput, reply: ModelRunnerOutput, outputs: Outputs,
                    reps: int) -> dict:
    """In-process msgspec costs on the round trip's path (one call each),
    then the engine's message to its client after the step (not in
    ``total``: it crosses another socket)."""
    plan_bytes, reply_bytes = encode(plan), encode(reply)
    parts = {
        "encode_plan": time_call_us(encode, plan, reps),
        "decode_plan": time_call_us(decode_broadcast, plan_bytes, reps),
        "encode_reply": time_call_us(encode, reply, reps),
        "decode_reply": time_call_us(decode_reply, reply_bytes, reps),
    }
    parts["total"] = round(sum(parts.values()), 2)
    parts["encode_outputs"] = time_call_us(encode, outputs, reps)
    parts["decode_outputs"] = time_call_us(decode_server_message, encode(outputs), reps)
    return parts


def print_table(summary: dict) -> None:
    sizes = summary["message_bytes"]
    print(f"SchedulerOutput ({summary['config']['num_reqs']} decode requests): "
          f"{sizes['scheduler_output']} bytes; ModelRunnerOutput: "
          f"{sizes['model_runner_output']} bytes; the engine's Outputs: "
          f"{sizes['engine_outputs']} bytes")
    serde = summary["serde_us"]
    print("msgspec, in process (us): " + ", ".join(f"{k} {v}" for k, v in serde.items()))
    header = (f"{'transport':>9} {'tp':>3} | {'ipc med':>8} {'p90':>7} {'p99':>7} | "
              f"{'bare med':>8} {'p90':>7} {'p99':>7} | {'ratio med':>9} {'p99':>6}")
    print(header)
    print("-" * len(header))
    for row in summary["results"]:
        ipc, bare = row["ipc_us"], row["bare_us"]
        print(f"{row['transport']:>9} {row['tp']:>3} | {ipc['median']:>8} {ipc['p90']:>7} "
              f"{ipc['p99']:>7} | {bare['median']:>8} {bare['p90']:>7} {bare['p99']:>7} | "
              f"{row['ratio_median']:>9} {row['ratio_p99']:>6}")
    for transport, met in summary["target"]["met"].items():
        print(f"target (tp {TARGET_TP}, {transport}): ipc/bare median <= {TARGET_RATIO}: {met}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--iters", type=int, default=2000, help="measured round trips per mode")
    parser.add_argument("--warmup", type=int, default=200, help="left-out round trips per mode")
    parser.add_argument("--rounds", type=int, default=20, help="alternating blocks per mode")
    parser.add_argument("--transport", nargs="+", choices=("ipc", "tcp"), default=["ipc", "tcp"],
                        help="ipc:// (what tprun uses) and/or tcp://127.0.0.1 loopback")
    parser.add_argument("--num-reqs", type=int, default=256)
    parser.add_argument("--start-timeout", type=float, default=60.0)
    parser.add_argument("--out", help="also write the JSON summary here")
    args = parser.parse_args(argv)
    if min(args.tp) < 1 or max(args.tp) > 255:
        parser.error("--tp sizes must be in 1..255")
    if args.iters < args.rounds or args.warmup < 0 or args.num_reqs < 1:
        parser.error("need --iters >= --rounds, --warmup >= 0, --num-reqs >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args.num_reqs)
    reply = make_reply(plan, sampled_tokens(args.num_reqs))
    outputs = make_outputs(plan, sampled_tokens(args.num_reqs))
    results = [measure(tp, transport, args, plan)
               for transport in args.transport for tp in args.tp]
    at_target = {r["transport"]: r["ratio_median"] for r in results if r["tp"] == TARGET_TP}
    summary = {
        "benchmark": "ipc_round_trip",
        "host": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                 "python": platform.python_version(), "pyzmq": zmq.__version__,
                 "libzmq": zmq.zmq_version(), "msgspec": msgspec.__version__},
        "config": {"tp": args.tp, "iters": args.iters, "warmup": args.warmup,
                   "rounds": args.rounds, "transport": args.transport,
                   "num_reqs": args.num_reqs},
        "message_bytes": {"scheduler_output": len(encode(plan)),
                          "model_runner_output": len(encode(reply)),
                          "engine_outputs": len(encode(outputs))},
        "serde_us": serde_breakdown(plan, reply, outputs, reps=2000),
        "results": results,
        "target": {"tp": TARGET_TP, "max_ratio": TARGET_RATIO,
                   "met": {t: ratio <= TARGET_RATIO for t, ratio in at_target.items()}},
    }
    print_table(summary)
    emit_summary(summary, args.out)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit(main())
