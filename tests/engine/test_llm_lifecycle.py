"""``LLM`` across calls: an interrupted ``generate`` leaves the engine idle
for the next one, a failed in-process step is a WorkerFailure naming rank 0
(and the next step fails at once), a shut-down LLM says so, and an LLM the
caller drops stops its workers."""

from __future__ import annotations

import gc
import os
import time

import pytest

from engine import LLM, SamplingParams
from executor.base import WorkerFailure

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [1, 2, 3]}, "The capital of France is"]


@pytest.fixture
def tiny_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path))


def _tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_interrupted_generate_leaves_the_engine_idle(tiny_cache, monkeypatch, async_scheduling):
    with LLM(model="tiny", device="cpu", async_scheduling=async_scheduling) as llm:
        want = _tokens(llm.generate(PROMPTS, GREEDY))
        engine, real_step, steps = llm.engine, llm.engine.step, []

        def interrupted_step():
            steps.append(1)
            deltas = real_step()
            if len(steps) == 3:  # mid-generation, a step in flight when async
                raise KeyboardInterrupt
            return deltas

        monkeypatch.setattr(engine, "step", interrupted_step)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, GREEDY)
        monkeypatch.setattr(engine, "step", real_step)
        assert not engine.scheduler.has_unfinished_requests()
        assert _tokens(llm.generate(PROMPTS, GREEDY)) == want


@pytest.mark.timeout(120)
def test_failed_in_process_step_is_a_worker_failure(tiny_cache, monkeypatch):
    llm = LLM(model="tiny", device="cpu")
    try:
        worker = llm.engine.executor.worker

        def broken(plan):
            raise IndexError("a bug in the runner")

        monkeypatch.setattr(worker, "execute_model", broken)
        with pytest.raises(WorkerFailure, match=r"worker rank 0 \(in process\) failed step \d+"):
            llm.generate(PROMPTS, GREEDY)
        monkeypatch.undo()
        with pytest.raises(WorkerFailure, match="IndexError: a bug in the runner"):
            llm.generate(PROMPTS, GREEDY)  # the runner's state is not trusted again
    finally:
        llm.shutdown()


@pytest.mark.timeout(120)
def test_shut_down_llm_and_bad_sampling_params_say_so(tiny_cache):
    llm = LLM(model="tiny", device="cpu")
    with pytest.raises(ValueError, match="sampling_params is a SamplingParams or a list"):
        llm.generate("hi", {"max_tokens": 3})
    with pytest.raises(ValueError, match="sampling_params is a SamplingParams or a list"):
        llm.generate(["hi"], [None])
    llm.shutdown()
    llm.shutdown()  # twice is fine
    with pytest.raises(RuntimeError, match="has been shut down"):
        llm.generate("hi", GREEDY)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_dropped_llm_stops_its_workers(tiny_cache):
    llm = LLM(model="tiny", device="cpu", tensor_parallel_size=2)
    pids = [p.pid for p in llm.engine.executor.procs]
    assert len(_tokens(llm.generate(PROMPTS, GREEDY))) == 2
    del llm
    gc.collect()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
