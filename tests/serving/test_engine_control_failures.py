"""Engine controls (``EngineControl``) whose work fails: the client that
asked hears why, however the engine fails, and is never left waiting."""

import asyncio

import pytest

from executor.base import WorkerFailure
from serving.async_client import AsyncEngineClient
from serving.async_llm import AsyncLLM
from serving.protocol_core import EngineStoppedError


@pytest.mark.timeout(120)
def test_a_control_whose_workers_fail_tells_its_client_the_engine_stopped():
    """A client with no request of its own (a second front end) asks the
    engine to sleep; the workers fail during the call, which ends the
    engine's loop: that client hears ``EngineStopped`` with the reason, as a
    client with live requests does, rather than waiting out its control
    timeout (or, for the profiler's controls, forever)."""
    llm = AsyncLLM(model="tiny", device="cpu", enable_sleep_mode=True)
    background = llm._background

    def workers_fail(*args, **kwargs):  # a dead worker, as the executor reports it
        raise WorkerFailure("worker rank 0 exited during sleep")

    async def run():
        await llm.stats()  # the loop serves
        other = AsyncEngineClient(background.server.inproc_address, background.secret,
                                  context=background.server.ctx, control_timeout_s=3600)
        await other.start()
        try:
            background.engine.executor.collective_rpc = workers_fail
            background.engine.executor.check_health = workers_fail
            with pytest.raises(EngineStoppedError, match="worker rank 0 exited during sleep"):
                await asyncio.wait_for(other.control("sleep", level=1), 60)
        finally:
            other.close_now()

    try:
        asyncio.run(run())
    finally:
        del background.engine.executor.collective_rpc  # the real ones stop the worker
        del background.engine.executor.check_health
        llm.shutdown()


@pytest.mark.timeout(120)
def test_a_wake_up_that_fails_on_live_workers_is_its_answers_error(tmp_path):
    """Waking needs the memory back, which another process may hold now
    (sleep mode's use: a trainer between rollouts): an out-of-memory error
    on a worker that still serves is the call's error, as vLLM answers a
    failed utility call; the engine lives on, still asleep, and a later
    wake_up brings it back to the tokens it gave before the sleep."""
    import torch

    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    llm = AsyncLLM(model="tiny", device="cpu", enable_sleep_mode=True)
    runner = llm._background.engine.executor.worker.runner
    wake_up = runner.wake_up

    def out_of_memory_once(tags=None):
        runner.wake_up = wake_up
        raise torch.OutOfMemoryError("out of memory: another process holds the device")

    async def tokens(request_id):
        async for out in llm.generate({"prompt_token_ids": [3, 14, 15, 92]}, params,
                                      request_id):
            last = out
        return last.outputs[0].token_ids

    async def run():
        before = await tokens("before")
        await llm.sleep(level=1)
        runner.wake_up = out_of_memory_once
        with pytest.raises(RuntimeError, match="another process holds the device"):
            await llm.wake_up()
        await llm.check_health()
        assert await llm.is_sleeping()
        await llm.wake_up()
        assert not await llm.is_sleeping()
        assert await tokens("after") == before

    try:
        asyncio.run(run())
    finally:
        llm.shutdown()


@pytest.mark.timeout(120)
def test_stats_wait_for_a_control_the_engine_is_running():
    """The engine's loop runs a control in its own thread (a sleep copying
    the weights, a stop writing traces) and answers nothing meanwhile: the
    same client's stats (``/health``, ``/metrics``) wait for it rather than
    calling the engine dead after ``stats_timeout_s``, as vLLM's health
    check does not fail while the engine works on a utility call."""
    import threading

    llm = AsyncLLM(model="tiny", device="cpu", enable_sleep_mode=True)
    runner = llm._background.engine.executor.worker.runner
    sleep, release = runner.sleep, threading.Event()

    def slow_sleep(level=1):
        release.wait(60)  # the copy to the host, however long it takes
        sleep(level)

    runner.sleep = slow_sleep

    async def run():
        client = await llm._connect()
        client.stats_timeout_s = 0.2
        sleeping = asyncio.ensure_future(llm.sleep(level=1))
        stats = asyncio.ensure_future(client.stats())
        await asyncio.sleep(1.0)  # five stats timeouts while the engine is busy
        release.set()
        await sleeping
        return await stats

    try:
        stats = asyncio.run(run())
    finally:
        release.set()
        llm.shutdown()
    assert stats.num_running == 0
