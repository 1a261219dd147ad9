"""Worker daemons over ZeroMQ: one process per TP rank.

The executor binds a PUB socket (steps and control calls, encoded once) and
two PULL sockets: replies and step outputs. A reader thread owns the reply
socket: it resolves control futures once every rank has answered, fails a
step a rank reports failed, and watches the worker processes: a dead worker
fails every pending future at once with an error naming its rank and exit
code. The output rank sends step outputs on the output socket, which the
thread waiting for a step reads itself (``executor.step_future``); the
reader nudges that thread whenever it settles a step. A reply that
decodes but makes no sense (a rank outside the world, a rank's second
answer to a call, a control reply on the output channel) is dropped with a
log line; no reply stops either thread.
Every rank sends a heartbeat twice a second with the last step it started
and finished: a step still pending after ``step_timeout_s`` fails with an
error naming the ranks that have not finished it.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

import zmq

from executor import stop_signals
from executor.base import Executor, StepRejected, WorkerFailure
from executor.rendezvous import AGENT_STORE_ENV, host_store
from executor.step_future import OutputPump, StepFuture
from ipc.channels import (
    BroadcastPublisher,
    OutputNudger,
    OutputReceiver,
    ReplyReceiver,
    wait_for_subscribers,
)
from ipc.endpoints import Endpoints
from ipc.messages import (
    ControlCall,
    ControlReply,
    GrammarBitmask,
    Heartbeat,
    ModelRunnerOutput,
    Reply,
    SchedulerOutput,
    WorkerError,
)
from worker.env import NO_MULTICAST, disable_multicast

__all__ = ["NO_MULTICAST", "MultiprocExecutor", "exited_worker", "free_port", "spawn_worker",
           "stop_workers", "worker_environ"]

logger = logging.getLogger(__name__)

SILENT_AFTER_S = 2.0  # heartbeats come every 0.5 s
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# How long an interrupted launch waits for its workers before killing them.
INTERRUPTED_STOP_S = 0.5


def module_command(module: str) -> list[str]:
    """``python -m MODULE`` without the current folder on the import path:
    a ``worker.py`` (or ``engine.py``, ...) in the caller's folder must not
    replace the package. ``-P`` (Python 3.11+) leaves the folder out;
    before it, the ``''`` entry that ``-c`` puts first is removed by hand.
    PYTHONPATH keeps its meaning either way."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module]
    code = ("import runpy, sys; del sys.path[0]; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", code]


def worker_environ(rank: int, world_size: int, master_addr: str,
                   master_port: int) -> dict[str, str]:
    """This process's environment plus what a spawned worker reads: torchrun's
    variables for ``rank``, the project first on PYTHONPATH (the worker
    imports this checkout), ``TPRUN_PARENT_PID`` (the worker dies with this
    process, see worker/parent_death.py) and NVLink multicast off."""
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR=master_addr,
               MASTER_PORT=str(master_port))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, env.get("PYTHONPATH")]))
    env["TPRUN_PARENT_PID"] = str(os.getpid())
    disable_multicast(env)
    return env


def spawn_worker(module: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """``python -m MODULE ARGS`` (see ``module_command``) with ``env``, stdin closed.

    The child starts with SIGINT blocked (the signal mask survives fork and
    exec): a job's Ctrl-C then cannot cut the interpreter's own start-up,
    which no handler covers, and print its traceback; ``python -m worker``
    ignores SIGINT, then unblocks it.

    The child inherits this process's signal delivery record
    (``stop_signals.delivery_record``; its descriptor named in the child's
    environment): ``python -m worker`` lets a SIGTERM that reached this
    process too wait for this process to stop it (worker/job_signals.py)."""
    record = stop_signals.delivery_record()
    if record is not None:
        env = {**env, stop_signals.RECORD_FD_ENV: str(record)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return subprocess.Popen([*module_command(module), *args], env=env,
                                stdin=subprocess.DEVNULL,
                                pass_fds=() if record is None else (record,))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def exited_worker(procs: list[subprocess.Popen]) -> WorkerFailure | None:
    """A failure naming the first worker (by rank) that has exited, if any."""
    for rank, proc in enumerate(procs):
        code = proc.poll()
        if code is not None:
            return WorkerFailure(f"worker rank {rank} (pid {proc.pid}) exited with code {code}")
    return None


def shared_signal_exit(procs: list[subprocess.Popen]) -> str | None:
    """If a worker died of a job signal this process received too (Ctrl-C,
    ``kill %1``): a line saying so (a shutdown, not a failure)."""
    for rank, proc in enumerate(procs):
        if stop_signals.shared_with_parent(proc.poll()):
            name = signal.Signals(-proc.returncode).name
            return f"worker rank {rank} stopped by {name}, as was this process: shutting down"
    return None


def stop_workers(procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` in all for the workers to exit, then kill
    every one left in one pass before waiting on any: a worker killed alone
    leaves its peers failing in a collective or a connect, and they would
    print that failure to the terminal before their own turn came."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    left = [proc for proc in procs if proc.poll() is None]
    for proc in left:
        proc.kill()
    for proc in left:
        proc.wait()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class MultiprocExecutor(Executor):
    def __init__(self, world_size: int, device: str, master_addr: str = "127.0.0.1",
                 master_port: int | None = None, start_timeout_s: float = 120.0,
                 step_timeout_s: float = 300.0, attach_dir: str | None = None):
        """Spawn one worker daemon per rank, or, with ``attach_dir``, bind the
        endpoints there and wait for workers started elsewhere (torchrun:
        ``torchrun --nproc-per-node N -m worker --broadcast ipc://DIR/broadcast
        --reply ipc://DIR/reply --output ipc://DIR/output``). Attached workers
        are watched through their heartbeats only: one silent for
        ``SILENT_AFTER_S`` fails the executor."""
        self.world_size = world_size
        self.attached = attach_dir is not None
        self.step_timeout_s = step_timeout_s
        self.step_sent_at: dict[int, float] = {}
        self.heartbeats: dict[int, Heartbeat] = {}
        self.heartbeat_at: dict[int, float] = {}
        self.lock = threading.Lock()
        self.step_futures: dict[int, Future] = {}
        self.control_futures: dict[int, tuple[Future, dict[int, Any]]] = {}
        self.call_ids = itertools.count()
        self.failure: WorkerFailure | None = None
        self.closing = False
        self.procs: list[subprocess.Popen] = []
        # What shutdown releases, None until made: a start stopped half-way
        # (a failure, a signal) releases what it got to.
        self.store = self.endpoints = self.ctx = self.reader = None
        self.publisher = self.receiver = self.pump = self.nudger = None
        try:
            # Spawned ranks meet through a store this process holds (see
            # executor/rendezvous.py); torchrun's agent holds it for attached ones.
            if not self.attached and world_size > 1:
                self.store = host_store(master_addr, master_port or 0)
            self.endpoints = Endpoints.create(attach_dir)
            self.ctx = zmq.Context()
            self.publisher = BroadcastPublisher(self.ctx, self.endpoints.broadcast)
            self.receiver = ReplyReceiver(self.ctx, self.endpoints.reply)
            nudge_address = f"inproc://tprun-step-nudge-{id(self):x}"
            self.pump = OutputPump(OutputReceiver(self.ctx, self.endpoints.output, nudge_address),
                                   self._on_step_reply)
            self.nudger = OutputNudger(self.ctx, nudge_address)  # the reader thread's
            port = (self.store.port if self.store is not None
                    else master_port or free_port(master_addr))
            if self.attached:  # someone must start them: say where, and how
                print(f"tprun: waiting for {world_size} workers at {self.endpoints.directory} "
                      f"(e.g. torchrun --standalone --nproc-per-node {world_size} -m worker "
                      f"--broadcast {self.endpoints.broadcast} --reply {self.endpoints.reply} "
                      f"--output {self.endpoints.output})",
                      file=sys.stderr, flush=True)
            else:
                for rank in range(world_size):
                    self.procs.append(self._spawn(rank, device, master_addr, port))
            wait_for_subscribers(self.publisher, self.receiver, world_size,
                                 start_timeout_s, self._raise_if_dead)
        except BaseException:
            self.shutdown()
            raise
        self.reader = threading.Thread(target=self._read_replies, name="replies", daemon=True)
        self.reader.start()

    def _spawn(self, rank: int, device: str, addr: str, port: int) -> subprocess.Popen:
        env = worker_environ(rank, self.world_size, addr, port)
        if self.store is not None:
            env.update(AGENT_STORE_ENV)
        return spawn_worker("worker", ["--broadcast", self.endpoints.broadcast,
                                       "--reply", self.endpoints.reply,
                                       "--output", self.endpoints.output, "--device", device], env)

    # ---- failure detection ---------------------------------------------
    def _dead_worker(self) -> WorkerFailure | None:
        if (failure := exited_worker(self.procs)) is not None:
            return failure
        if self.attached and self.heartbeat_at:
            now = time.monotonic()
            for rank in range(self.world_size):
                silent = now - self.heartbeat_at.get(rank, now)
                if silent > SILENT_AFTER_S:
                    return WorkerFailure(f"attached worker rank {rank} sent no heartbeat "
                                         f"for {silent:.1f}s")
        return None

    def _raise_if_dead(self) -> None:
        if (failure := self._dead_worker()) is not None:
            raise failure

    def _fail_all(self, failure: WorkerFailure) -> None:
        """Fail every pending future with ``failure`` and log it, for the
        first failure only: what follows it (a peer's broken collective, the
        same dead rank seen again) is its consequence. A rank that died of a
        signal this process received too is a shutdown: logged at INFO."""
        with self.lock:
            if self.failure is not None:
                return
            self.failure = failure
            futures = list(self.step_futures.values())
            futures += [f for f, _ in self.control_futures.values()]
            self.step_futures.clear()
            self.step_sent_at.clear()
            self.control_futures.clear()
        if (line := shared_signal_exit(self.procs)) is not None:
            logger.info("%s", line)
        else:
            logger.error("%s", failure)
        for future in futures:
            if not future.done():
                future.set_exception(failure)

    # ---- the reader thread ---------------------------------------------
    def _read_replies(self) -> None:
        """Settle futures from the reply channel and watch the workers until
        shutdown. A reply that decodes but makes no sense here (a rank this
        executor does not run, a second answer from one rank) is dropped with
        one log line, and counts as no reply: the watch goes on."""
        while not self.closing:
            reply = self.receiver.recv(timeout_ms=100)
            if reply is not None and self._out_of_world(reply):
                reply = None
            if reply is None or isinstance(reply, Heartbeat):
                if reply is not None:
                    self.heartbeats[reply.rank] = reply
                    self.heartbeat_at[reply.rank] = time.monotonic()
                failure = None if self.closing else self._dead_worker() or self._stuck_step()
                if failure is not None:
                    self._fail_all(failure)
                    self.nudger.nudge()
                    return
            elif isinstance(reply, ControlReply):
                self._on_control_reply(reply)
            elif isinstance(reply, (ModelRunnerOutput, WorkerError)):
                # A rank's step error, or the output of a worker without --output.
                self._on_step_reply(reply)
                self.nudger.nudge()

    def _out_of_world(self, reply: Reply) -> bool:
        """True, after one warning, for a reply naming a rank outside
        0..world_size-1 (a forged message, a worker of another world): it
        must neither count as a rank's answer nor fail the executor."""
        rank = getattr(reply, "rank", None)
        if rank is None or 0 <= rank < self.world_size:
            return False
        logger.warning("dropped a %s from rank %d: this executor runs ranks 0..%d",
                       type(reply).__name__, rank, self.world_size - 1)
        return True

    def _on_step_reply(self, reply: Reply) -> None:
        """Settle the step a reply names (in the reader thread, or in the
        thread that waits for a step, which reads the output channel)."""
        if self._out_of_world(reply):
            return
        if not isinstance(reply, (ModelRunnerOutput, WorkerError)):  # on the output channel
            logger.warning("dropped a %s on the step output channel", type(reply).__name__)
        elif isinstance(reply, ModelRunnerOutput):
            self._resolve_step(reply.step_id, result=reply)
        elif isinstance(reply, WorkerError) and not reply.fatal:
            self._resolve_step(reply.step_id, error=StepRejected(
                f"step {reply.step_id} rejected by rank {reply.rank}: {reply.error}"))
        elif isinstance(reply, WorkerError) and self.failure is None:
            failure = self._dead_worker_soon() or WorkerFailure(
                f"worker rank {reply.rank} failed step {reply.step_id}:\n{reply.error}"
            )
            self._fail_all(failure)

    def _dead_worker_soon(self, wait_s: float = 0.5) -> WorkerFailure | None:
        """A rank's step often fails because a peer died under a collective:
        name the dead peer, if one shows up within ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if (failure := self._dead_worker()) is not None:
                return failure
            time.sleep(0.02)
        return None

    def _resolve_step(self, step_id: int, result=None, error: Exception | None = None) -> None:
        with self.lock:
            future = self.step_futures.pop(step_id, None)
            self.step_sent_at.pop(step_id, None)
        if future is None:  # settled already (every rank rejects a step alike), or never sent
            logger.debug("dropped a reply to step %d: no such step is pending", step_id)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def _stuck_step(self) -> WorkerFailure | None:
        """A failure naming the ranks behind on the oldest overdue step."""
        with self.lock:
            if not self.step_sent_at:
                return None
            step_id, sent = min(self.step_sent_at.items())
        waited = time.monotonic() - sent
        if waited < self.step_timeout_s:
            return None
        now = time.monotonic()
        behind = [r for r in range(self.world_size)
                  if r not in self.heartbeats or self.heartbeats[r].step_finished < step_id]
        silent = [r for r in range(self.world_size)
                  if now - self.heartbeat_at.get(r, sent) > SILENT_AFTER_S]
        return WorkerFailure(
            f"step {step_id} did not complete within {self.step_timeout_s:g}s: ranks {behind} "
            f"have not finished it; ranks {silent} sent no heartbeat for {SILENT_AFTER_S:g}s")

    def _on_control_reply(self, reply: ControlReply) -> None:
        """Count one rank's answer to a pending call (reply.rank is in the
        world: ``_out_of_world``); the call settles on the first error or
        once every rank has answered. A reply to no pending call (settled by
        an error already, or never made) or a rank's second answer to one
        call is dropped with a log line."""
        with self.lock:
            entry = self.control_futures.get(reply.call_id)
            if entry is None:
                logger.debug("dropped rank %d's reply to call %d: no such call is pending",
                             reply.rank, reply.call_id)
                return
            future, results = entry
            if reply.rank in results:
                logger.warning("dropped rank %d's second reply to call %d", reply.rank,
                               reply.call_id)
                return
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
                       timeout: float | None = 300.0) -> list[Any]:
        call_id = next(self.call_ids)
        future: Future = Future()
        self._register(self.control_futures, call_id, (future, {}))
        self.publisher.publish(ControlCall(call_id=call_id, method=method, kwargs=kwargs or {}))
        return future.result(timeout=timeout)

    def execute_model(self, plan: SchedulerOutput) -> Future:
        future = StepFuture(self.pump)
        self._register(self.step_futures, plan.step_id, future)
        with self.lock:
            self.step_sent_at[plan.step_id] = time.monotonic()
        self.publisher.publish(plan)
        return future

    def sample_tokens(self, grammar: GrammarBitmask) -> None:
        with self.lock:
            if self.failure is not None:
                raise self.failure
        self.publisher.publish(grammar)

    def check_health(self) -> None:
        if self.failure is not None:  # set by the reader thread, which watches every rank
            raise self.failure

    def shutdown(self) -> None:
        if self.closing:
            return
        self.closing = True
        if self.reader is not None:
            self.reader.join(timeout=2)
        if self.failure is not None or exited_worker(self.procs) is not None:
            # A failed group, or one a rank has left (even before the start
            # ended), may sit in a collective or a rendezvous forever: do not wait.
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
        if self.publisher is not None:
            try:
                self.publisher.publish(ControlCall(call_id=-1, method="shutdown"))
            except zmq.ZMQError:
                pass
        # Interrupted (Ctrl-C, kill): a worker still importing or loading
        # would not read the shutdown call for seconds; do not wait for it.
        stop_workers(self.procs, timeout_s=INTERRUPTED_STOP_S if stop_signals.stopping() else 5)
        self.store = None  # every rank has left the process group: let it go
        for sock in (self.publisher, self.receiver, self.nudger):
            if sock is not None:
                sock.close()
        if self.pump is not None:
            with self.pump.lock:  # no thread is reading it any more
                self.pump.receiver.close()
        if self.ctx is not None:
            self.ctx.term()
        if self.endpoints is not None:
            self.endpoints.cleanup()
