"""``tprun serve --data-parallel-size D``: replicas 1..D-1 of the engine,
each a ``tprun serve`` child process (no HTTP) with its own workers.

Replica 0 is the serving process's own engine, as without data
parallelism; every other replica is a child started with the serve
options the parent parsed (sent as JSON on its stdin, ``launch.replica``),
less the HTTP front end's, plus an endpoint file in a private directory of
the parent and its index (``data_parallel_rank``: its workers' trace names). Each child is the executor process of its own T ranks: its own
engine loop (its own interpreter: no GIL shared between engine loops), its
own rendezvous (``--master-port`` P gives replica d P + d; none: a free
port each) and, on CUDA, the devices of local ranks d*T .. d*T+T-1 (as
``CUDA_VISIBLE_DEVICES``, so that its workers' LOCAL_RANK 0..T-1 pick them).

A child runs in the parent's process group with SIGINT blocked (a
terminal's Ctrl-C stops the parent, which stops the children with SIGTERM;
a job's SIGTERM to the whole group is a clean stop of each) and dies with
the parent (``TPRUN_PARENT_PID``). Its stderr passes through, each line prefixed
``[replica d]``, except its last ``tprun: error:`` line, which becomes the
parent's one error line, naming the replica (``failure``), and its lines
that only say it stopped. ``watch`` calls back once any child has ended
on its own; ``terminate`` asks them all to stop (SIGTERM), ``stop`` ends
them all (SIGTERM, then SIGKILL) and removes the private directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from executor.multiproc import module_command
from ipc.auth import sibling_key_file
from ipc.endpoints import private_directory, remove_stale_directories

# serve's options that only the HTTP front end reads: a replica takes their defaults.
_FRONT_END_DEFAULTS = dict(
    http_port=None, host=None, port=None, endpoint_file=None, api_key=None,
    served_model_name=None, allowed_origins=None, chat_template=None,
    trust_request_chat_template=False, uvicorn_log_level=None, log_requests=None,
    enable_responses_api_store=None, stream_interval=None, response_role=None,
    enable_auto_tool_choice=False, tool_call_parser=None, lora_modules=None,
    allow_runtime_lora_updating=None, enable_server_load_tracking=False,
    data_parallel_size=1)
# A child's lines that only say it stopped: the parent says that itself
# (a child stopped alone names it in its failure).
_STOP_LINES = ("tprun: interrupted", "tprun: stopped by", "tprun serve: stopped by")
STOP_GRACE_S = 30.0
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ranks_of(replica: int, tp: int) -> str:
    """The local ranks of ``replica``, as its error line names them."""
    first = replica * tp
    return f"local rank {first}" if tp == 1 else f"local ranks {first}-{first + tp - 1}"


def replica_devices(replica: int, tp: int, world: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` of ``replica``: its T devices, of those this
    process sees (``CUDA_VISIBLE_DEVICES`` as given, else 0 .. world-1)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = given.split(",") if given else [str(i) for i in range(world)]
    return ",".join(visible[replica * tp:(replica + 1) * tp])


class Replica:
    """One child ``tprun serve`` and the thread that relays its stderr."""

    def __init__(self, index: int, tp: int, args: dict, env: dict[str, str], endpoint_file: str):
        self.index = index
        self.tp = tp
        self.endpoint_file = endpoint_file
        self.error: str | None = None
        self.stopped: str | None = None  # its stop line, less "tprun...: "
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # kept across exec
        try:
            self.process = subprocess.Popen(
                [*module_command("launch.replica")], env=env, stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.process.stdin.write(json.dumps(args).encode())
        self.process.stdin.close()
        self.relay = threading.Thread(target=self._relay, name=f"replica-{index}-stderr",
                                      daemon=True)
        self.relay.start()

    @property
    def name(self) -> str:
        return f"data-parallel replica {self.index} ({ranks_of(self.index, self.tp)})"

    def failure(self) -> str:
        """Why it ended: its error line, else its stop line (a signal to it
        alone), else its exit status."""
        self.relay.join(2.0)  # its last line (its workers close the pipe as they die)
        code = self.process.returncode
        why = self.error or self.stopped or (
            f"exited with status {code}" if code is None or code >= 0
            else f"killed by {signal.Signals(-code).name}")
        return f"{self.name} failed: {why}"

    def _relay(self) -> None:
        for raw in self.process.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith("tprun: error: "):
                self.error = line[len("tprun: error: "):]
            elif line.startswith(_STOP_LINES):
                self.stopped = line.split(": ", 1)[1]
            else:
                print(f"[replica {self.index}] {line}", file=sys.stderr, flush=True)


class ReplicaProcesses:
    """Replicas 1..D-1 of ``tprun serve -dp D`` (replica 0 is the caller's)."""

    def __init__(self, args: argparse.Namespace, tp: int, dp: int, device: str) -> None:
        self.directory = private_directory("dp-")
        self.stopping = False
        self.failed: str | None = None
        self.replicas: list[Replica] = []
        try:
            for index in range(1, dp):
                self.replicas.append(self._start(args, index, tp, dp, device))
        except BaseException:
            self.stop()
            raise

    def _start(self, args: argparse.Namespace, index: int, tp: int, dp: int,
               device: str) -> Replica:
        child = {**vars(args), **_FRONT_END_DEFAULTS, "nproc_per_node": tp,
                 "endpoint_file": os.path.join(self.directory, f"replica-{index}"),
                 "data_parallel_rank": index}
        child.pop("tensor_parallel_size", None)  # the child's TP is --nproc-per-node's
        if args.master_port is not None:
            child["master_port"] = args.master_port + index
        env = dict(os.environ, TPRUN_PARENT_PID=str(os.getpid()))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT,
                                                          env.get("PYTHONPATH")]))
        if device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = replica_devices(index, tp, tp * dp)
        return Replica(index, tp, child, env, child["endpoint_file"])

    def wait_ready(self) -> list[tuple[str, bytes]]:
        """Each replica's (engine endpoint, secret) once every one serves;
        ``WorkerFailure`` naming a replica that ended first."""
        from executor.base import WorkerFailure
        from serving.client import find_secret, read_endpoint_file

        for replica in self.replicas:
            while not os.path.exists(replica.endpoint_file):
                if replica.process.poll() is not None:
                    raise WorkerFailure(replica.failure())
                time.sleep(0.1)
        return [(read_endpoint_file(r.endpoint_file), find_secret(r.endpoint_file))
                for r in self.replicas]

    def key_files(self) -> list[str]:
        """Each replica's key file (beside its endpoint file), in replica order."""
        return [sibling_key_file(r.endpoint_file) for r in self.replicas]

    def watch(self, on_failure: Callable[[], None]) -> None:
        """Call ``on_failure`` (from a thread) once a replica ends before
        ``stop``, unless a job signal is stopping this process (a SIGTERM to
        the whole process group ends the replicas too)."""
        from executor import stop_signals

        def run() -> None:
            while not self.stopping:
                for replica in self.replicas:
                    ended = replica.process.poll() is not None
                    if ended and not self.stopping and not stop_signals.stopping():
                        self.failed = replica.failure()
                        on_failure()
                        return
                time.sleep(0.1)

        threading.Thread(target=run, name="replica-watch", daemon=True).start()

    def terminate(self) -> None:
        """Ask every replica to stop (SIGTERM: a clean stop, its clients
        told that its engine is shutting down), without waiting: called as
        the serving process stops its own engine, before its HTTP server,
        so that no replica's open stream holds that server's shutdown."""
        self.stopping = True
        for replica in self.replicas:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """End every replica (``terminate``; SIGKILL after
        ``STOP_GRACE_S``) and remove the private directory, with whatever a
        killed replica left in it."""
        self.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for replica in self.replicas:
            try:
                replica.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                replica.process.kill()
                replica.process.wait()
            replica.relay.join(2.0)
        shutil.rmtree(self.directory, ignore_errors=True)
        remove_stale_directories()  # a killed replica's own socket directory
