"""Stopping at TP=2 is quiet and orderly; NVLink multicast is off everywhere.

The engine process holds the store the ranks' process group met through
(executor/rendezvous.py) and lets it go only after every worker exited;
each worker leaves its group after a barrier. A TP=2 run on the CPU (gloo)
then prints nothing on stderr at all; on two GPUs (NCCL) nothing but the
graph-capture progress bar.
"""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

from engine import LLM, SamplingParams
from tests.helpers.proc_utils import run_in_session
from worker.env import NO_MULTICAST

SCRIPT = """
import sys
from engine import LLM, SamplingParams
with LLM(model="tiny", tensor_parallel_size=2, device=sys.argv[1], max_num_seqs=4,
         max_num_batched_tokens=64, max_model_len=128, kv_cache_memory_bytes=4 << 20) as llm:
    out = llm.generate(["hello"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
print(len(out[0].outputs[0].token_ids))
"""


def run_tp2(device: str):
    from checkpoint.tiny_model import ensure_tiny_model

    ensure_tiny_model()
    result, leftovers = run_in_session([sys.executable, "-c", SCRIPT, device], timeout=170,
                                       env={"TPRUN_LOG_LEVEL": "WARNING"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "4"
    assert leftovers == []
    return result.stderr


@pytest.mark.timeout(180)
def test_tp2_shutdown_prints_nothing():
    assert run_tp2("cpu") == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA devices")
@pytest.mark.timeout(180)
def test_tp2_shutdown_on_gpus_prints_only_progress():
    # Rank 0 draws the CUDA-graph capture progress bar; nothing else may
    # appear (NCCL's watchdog once logged store errors as the engine stopped).
    lines = [line for line in re.split(r"[\r\n]+", run_tp2("cuda")) if line.strip()]
    assert [line for line in lines if not line.startswith("capturing CUDA graphs")] == []


def process_environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().decode().split("\0")
    return dict(e.split("=", 1) for e in entries if "=" in e)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(180)
def test_multicast_off_in_every_process(monkeypatch):
    for name in NO_MULTICAST:
        monkeypatch.delenv(name, raising=False)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    with LLM(model="tiny", device="cpu", executor="uni", max_num_seqs=4,
             kv_cache_memory_bytes=4 << 20) as llm:  # in this process
        llm.generate(["hi"], params)
        assert {n: os.environ.get(n) for n in NO_MULTICAST} == NO_MULTICAST
    for name in NO_MULTICAST:
        monkeypatch.delenv(name, raising=False)
    with LLM(model="tiny", device="cpu", executor="mp", max_num_seqs=4,
             kv_cache_memory_bytes=4 << 20) as llm:  # a worker daemon
        llm.generate(["hi"], params)
        for proc in llm.engine.executor.procs:
            env = process_environ(proc.pid)
            assert {n: env.get(n) for n in NO_MULTICAST} == NO_MULTICAST


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(180)
def test_the_executor_holds_the_store_until_the_workers_exit():
    with LLM(model="tiny", tensor_parallel_size=2, device="cpu", max_num_seqs=4,
             kv_cache_memory_bytes=4 << 20) as llm:
        executor = llm.engine.executor
        store = executor.store
        for proc in executor.procs:
            env = process_environ(proc.pid)
            assert env["MASTER_PORT"] == str(store.port)
            assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        store.set("probe", "1")  # the workers' group met here
        assert store.num_keys() > 1
    assert [proc.returncode for proc in executor.procs] == [0, 0]
    assert executor.store is None


class _Proc:
    """A worker process as stop_workers sees it: exits on its own after
    ``exits_after`` waits (never if None); records every call in ``log``."""

    def __init__(self, rank, log, exits_after=None):
        self.rank, self.log, self.exits_after, self.alive = rank, log, exits_after, True

    def poll(self):
        return None if self.alive else 0

    def wait(self, timeout=None):
        import subprocess

        self.log.append(("wait", self.rank))
        if self.alive and self.exits_after is not None:
            self.exits_after -= 1
            if self.exits_after <= 0:
                self.alive = False
        if self.alive and timeout is not None:
            raise subprocess.TimeoutExpired("worker", timeout)
        return 0

    def kill(self):
        self.log.append(("kill", self.rank))
        self.alive = False


def test_stop_workers_kills_every_one_left_before_waiting_on_any():
    """Past the deadline the workers still running are killed in one pass,
    so none is left running beside a peer already killed (it would fail in
    its collective and print that); one that exited is not killed."""
    from executor.multiproc import stop_workers

    log = []
    procs = [_Proc(0, log), _Proc(1, log, exits_after=1), _Proc(2, log)]
    procs[1].alive = False  # exited before the shutdown
    stop_workers(procs, timeout_s=0.0)
    kills = [i for i, (what, _) in enumerate(log) if what == "kill"]
    assert [log[i] for i in kills] == [("kill", 0), ("kill", 2)]
    assert kills == [kills[0], kills[0] + 1]  # back to back
    assert ("wait", 0) in log[kills[-1] + 1:] and ("wait", 2) in log[kills[-1] + 1:]
    assert not any(p.alive for p in procs)


def test_stop_workers_waits_for_workers_that_exit_in_time():
    from executor.multiproc import stop_workers

    log = []
    procs = [_Proc(0, log, exits_after=1), _Proc(1, log, exits_after=1)]
    stop_workers(procs, timeout_s=5.0)
    assert log == [("wait", 0), ("wait", 1)]
