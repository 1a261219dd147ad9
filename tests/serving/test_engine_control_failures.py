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

    def workers_fail(method, kwargs=None, timeout=300.0):
        raise WorkerFailure(f"worker rank 0 exited during {method}")

    async def run():
        await llm.stats()  # the loop serves
        other = AsyncEngineClient(background.server.inproc_address, background.secret,
                                  context=background.server.ctx, control_timeout_s=3600)
        await other.start()
        try:
            background.engine.executor.collective_rpc = workers_fail
            with pytest.raises(EngineStoppedError, match="worker rank 0 exited during sleep"):
                await asyncio.wait_for(other.control("sleep", level=1), 60)
        finally:
            other.close_now()

    try:
        asyncio.run(run())
    finally:
        del background.engine.executor.collective_rpc  # the real one stops the worker
        llm.shutdown()
