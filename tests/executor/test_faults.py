"""Faults: a dead, stopped or rejecting worker; a killed parent. Nothing hangs,
errors name the rank, and no process is left behind."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import zmq

from engine import LLM, SamplingParams, llm_engine
from executor import multiproc, step_future
from executor.base import StepRejected, WorkerFailure
from executor.multiproc import MultiprocExecutor
from ipc.endpoints import IPC_PATH_MAX
from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
from tests.helpers.checkpoints import runner_config
from tests.helpers.proc_utils import (
    ROOT,
    long_directory,
    pythonpath,
    run_tprun,
    session_pids,
    socket_dirs,
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _executor(tiny_dir, step_timeout_s=300.0) -> MultiprocExecutor:
    executor = MultiprocExecutor(2, "cpu", step_timeout_s=step_timeout_s)
    executor.initialize(runner_config(tiny_dir, max_num_seqs=4, max_num_batched_tokens=64,
                                      max_model_len=256), 32)
    return executor


def _new_plan(step_id: int, req_id: str = "a") -> SchedulerOutput:
    new = NewRequestData(req_id=req_id, prompt_token_ids=[1, 2, 3], prefill_token_ids=[1, 2, 3],
                         sampling=SamplingOptions(temperature=0.0), block_ids=[[0]],
                         num_computed_tokens=0, max_tokens=4)
    return SchedulerOutput(step_id=step_id, scheduled_new_reqs=[new],
                           num_scheduled_tokens=[3])


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_worker_killed_mid_run_fails_fast_naming_rank(tiny_dir):
    llm = LLM(model=tiny_dir, tensor_parallel_size=2, device="cpu", max_model_len=4096)
    pids = [p.pid for p in llm.engine.executor.procs]
    killed_at = []

    def kill_rank_1():
        time.sleep(1.0)
        killed_at.append(time.monotonic())
        os.kill(pids[1], signal.SIGKILL)

    threading.Thread(target=kill_rank_1).start()
    params = SamplingParams(temperature=0.0, max_tokens=3000, ignore_eos=True)
    with pytest.raises(WorkerFailure, match=r"worker rank 1 .*exited with code -9"):
        llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 4, params)
    assert time.monotonic() - killed_at[0] < 5.0  # not the 300 s step timeout
    llm.shutdown()
    assert _wait_gone(pids, 5.0) == []


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_rejected_plan_names_rank_and_workers_keep_serving(tiny_dir, monkeypatch):
    # A waiter's read blocks for an hour: a rejection (it comes on the reply
    # channel) reaches it only through the reader's nudge.
    monkeypatch.setattr(step_future, "SLICE_MS", 3_600_000)
    executor = _executor(tiny_dir)
    try:
        cached = CachedRequestData(req_ids=["ghost"], new_block_ids=[None])
        unknown = SchedulerOutput(step_id=0, scheduled_cached_reqs=cached,
                                  num_scheduled_tokens=[1])
        freed_twice = SchedulerOutput(step_id=1, finished_req_ids=["x", "x"])
        long_prompt = list(range(1, 101))
        over_budget = SchedulerOutput(step_id=2, scheduled_new_reqs=[NewRequestData(
            req_id="c", prompt_token_ids=long_prompt, prefill_token_ids=long_prompt,
            sampling=SamplingOptions(), block_ids=[list(range(7))], num_computed_tokens=0,
            max_tokens=2)], num_scheduled_tokens=[100])
        block_out = SchedulerOutput(step_id=3, scheduled_new_reqs=[NewRequestData(
            req_id="b", prompt_token_ids=[1], prefill_token_ids=[1], sampling=SamplingOptions(),
            block_ids=[[999]], num_computed_tokens=0, max_tokens=2)],
            num_scheduled_tokens=[1])
        bad_token = SchedulerOutput(step_id=4, scheduled_new_reqs=[NewRequestData(
            req_id="t", prompt_token_ids=[1, 99999], prefill_token_ids=[1, 99999],
            sampling=SamplingOptions(), block_ids=[[0]], num_computed_tokens=0, max_tokens=2)],
            num_scheduled_tokens=[2])
        bad_options = SchedulerOutput(step_id=5, scheduled_new_reqs=[NewRequestData(
            req_id="s", prompt_token_ids=[1], prefill_token_ids=[1],
            sampling=SamplingOptions(top_p=0.0), block_ids=[[0]], num_computed_tokens=0,
            max_tokens=2)], num_scheduled_tokens=[1])
        for plan, pattern in [(bad_options, r"request 's': top_p must be in \(0, 1\]"),(unknown, "unknown request 'ghost'"),
                              (bad_token, "outside the vocabulary"),
                              (freed_twice, "freed twice"),
                              (over_budget, "exceed max_num_batched_tokens 64"),
                              (block_out, "block id 999 outside the cache")]:
            with pytest.raises(StepRejected, match=pattern) as info:
                executor.execute_model(plan).result(timeout=30)
            assert "rank" in str(info.value)
        out = executor.execute_model(_new_plan(6)).result(timeout=30)
        assert [len(row) for row in out.rows()] == [1]
    finally:
        executor.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_stuck_step_reports_the_stuck_rank(tiny_dir):
    executor = _executor(tiny_dir, step_timeout_s=2.0)
    pids = [p.pid for p in executor.procs]
    try:
        os.kill(pids[1], signal.SIGSTOP)
        start = time.monotonic()
        # A starved rank 0 may be named beside rank 1 on a loaded machine.
        with pytest.raises(WorkerFailure, match=r"ranks \[(0, )?1\] sent no heartbeat") as info:
            executor.execute_model(_new_plan(0)).result(timeout=30)
        assert "did not complete within 2s" in str(info.value)
        assert time.monotonic() - start < 6
    finally:
        os.kill(pids[1], signal.SIGCONT)
        executor.shutdown()
    assert _wait_gone(pids, 5.0) == []


def _start_long_generate(tiny_dir, tmp_path, stderr):
    """tprun generating for a long time at TP=2, in its own session; returns
    the process once both workers exist, and the worker pids."""
    env = dict(os.environ, PYTHONPATH=pythonpath(), TPRUN_CACHE=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "--nproc-per-node", "2", "generate", "--model", tiny_dir,
         "--device", "cpu", "--max-tokens", "3000", "--ignore-eos"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
        start_new_session=True)
    deadline = time.monotonic() + 60
    while len(session_pids(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)  # let it generate
    return proc, sorted(p for p in session_pids(proc.pid) if p != proc.pid)


def _kill_session(sid: int) -> None:
    for pid in session_pids(sid):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_start_interrupted_after_the_model_loaded_stops_the_workers(tiny_dir, tmp_path,
                                                                     monkeypatch):
    """A signal (Ctrl-C here) between the workers' start-up and the engine's
    first step stops the workers and removes the executor's socket directory."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    executors = []
    make_executor = llm_engine.make_executor

    def kept_executor(*args):
        executors.append(make_executor(*args))
        return executors[-1]
    monkeypatch.setattr(llm_engine, "make_executor", kept_executor)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(llm_engine, "Scheduler", interrupted)
    with pytest.raises(KeyboardInterrupt):
        LLM(model=tiny_dir, tensor_parallel_size=2, device="cpu", max_model_len=4096)
    pids = [p.pid for p in executors[0].procs]
    assert len(pids) == 2 and _wait_gone(pids, 10.0) == []
    assert socket_dirs(tmp_path) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stop", [KeyboardInterrupt, zmq.ZMQError])
def test_start_stopped_while_binding_removes_the_socket_directory(tmp_path, monkeypatch, stop):
    """A signal or a bind error between the socket directory's creation and
    the first worker's spawn leaves no directory and spawns nothing."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = []

    def reply_receiver_fails(ctx, address):
        made.append(address)
        raise stop()
    monkeypatch.setattr(multiproc, "ReplyReceiver", reply_receiver_fails)
    monkeypatch.setattr(MultiprocExecutor, "_spawn", lambda *args: pytest.fail("spawned"))
    with pytest.raises(stop):
        MultiprocExecutor(2, "cpu")
    assert len(made) == 1 and socket_dirs(tmp_path) == []


@pytest.mark.timeout(30)
def test_socket_directory_too_long_is_a_one_line_error_before_any_worker(tmp_path):
    """A TMPDIR too long for a socket address: tprun says so in one line, and
    leaves no directory behind (no worker is started: the sockets come first)."""
    tmp = long_directory(tmp_path, IPC_PATH_MAX - len("/tprun-1-abcdefgh/output") + 1)
    os.makedirs(tmp)
    result, leftovers = run_tprun(["generate", "--model", "tiny", "--device", "cpu", "--prompt",
                                   "hi"], timeout=25, env={"TMPDIR": str(tmp),
                                                           "TPRUN_CACHE": str(tmp_path)})
    assert result.returncode == 1 and leftovers == [], result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("tprun: error: the socket path "), errors
    assert "TMPDIR" in errors[0] and "Traceback" not in result.stderr
    assert socket_dirs(tmp) == []


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_start_interrupted_while_spawning_stops_the_started_workers(tiny_dir, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    started = []
    spawn = MultiprocExecutor._spawn

    def spawn_one_then_interrupt(self, rank, *args):
        if rank == 1:
            raise KeyboardInterrupt
        started.append(spawn(self, rank, *args))
        return started[-1]
    monkeypatch.setattr(MultiprocExecutor, "_spawn", spawn_one_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        MultiprocExecutor(2, "cpu")
    assert len(started) == 1 and _wait_gone([started[0].pid], 10.0) == []
    assert socket_dirs(tmp_path) == []


@pytest.mark.timeout(60)
def test_a_rank_dead_before_the_handshake_fails_the_start_at_once(tmp_path, monkeypatch):
    """Rank 1 exits as it starts: the start fails naming it, and rank 0,
    which cannot meet its group any more, is killed rather than waited for
    (the 5 s a healthy rank gets to leave its group)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    started = []
    spawn = MultiprocExecutor._spawn

    def rank_1_exits(self, rank, *args):
        if rank == 1:
            started.append(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
        else:
            started.append(spawn(self, rank, *args))
        return started[-1]
    monkeypatch.setattr(MultiprocExecutor, "_spawn", rank_1_exits)
    begun = time.monotonic()
    with pytest.raises(WorkerFailure, match=r"worker rank 1 \(pid \d+\) exited with code 3"):
        MultiprocExecutor(2, "cpu")
    assert time.monotonic() - begun < 4.0
    assert _wait_gone([p.pid for p in started], 1.0) == []
    assert socket_dirs(tmp_path) == []


@pytest.mark.timeout(90)
def test_parent_killed_workers_exit(tiny_dir, tmp_path):
    proc, workers = _start_long_generate(tiny_dir, tmp_path, subprocess.DEVNULL)
    try:
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _wait_gone(workers, 5.0) == []
    finally:
        _kill_session(proc.pid)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_tprun_exits_nonzero_when_a_worker_dies(tiny_dir, tmp_path):
    proc, workers = _start_long_generate(tiny_dir, tmp_path, subprocess.PIPE)
    try:
        assert len(workers) == 2
        os.kill(workers[-1], signal.SIGKILL)
        # Generous: on a slow machine the kill can land before the ranks have
        # met, and the launch then also waits out the survivor's shutdown.
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0
        assert "worker rank" in err and "exited with code -9" in err
        assert _wait_gone(workers, 5.0) == []
    finally:
        _kill_session(proc.pid)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_exception_in_a_step_is_reported_with_rank_and_traceback(tiny_dir, monkeypatch):
    # Rank 1 raises in step 3 while rank 0 goes on into its all-reduce.
    monkeypatch.setenv("TPRUN_INJECT_STEP_FAULT", "1:3")
    llm = LLM(model=tiny_dir, tensor_parallel_size=2, device="cpu")
    pids = [p.pid for p in llm.engine.executor.procs]
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    start = time.monotonic()
    with pytest.raises(WorkerFailure) as info:
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], params)
    message = str(info.value)
    assert "worker rank 1 failed step 3" in message
    assert "Traceback" in message and "InjectedFault" in message
    assert time.monotonic() - start < 10
    llm.shutdown()
    assert _wait_gone(pids, 5.0) == []
