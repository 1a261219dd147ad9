"""TP=1 in process: the engine's thread runs the worker directly."""

from __future__ import annotations

from typing import Any

from executor.base import Executor
from ipc.messages import ModelRunnerOutput, SchedulerOutput
from worker.env import TorchrunEnv
from worker.worker import Worker


class _AsyncOutputFuture:
    """Resolves by calling ``get_output()``: the only wait on the device."""

    def __init__(self, async_output):
        self.async_output = async_output
        self.output: ModelRunnerOutput | None = None

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        if self.output is None:
            self.output = self.async_output.get_output()
        return self.output


class UniprocExecutor(Executor):
    def __init__(self, device: str):
        self.world_size = 1
        env = TorchrunEnv(rank=0, local_rank=0, world_size=1, local_world_size=1,
                          master_addr="127.0.0.1", master_port=0)
        self.worker = Worker(env, device)

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None,
                       timeout: float = 300.0) -> list[Any]:
        return [self.worker.call(method, kwargs or {})]

    def execute_model(self, plan: SchedulerOutput) -> _AsyncOutputFuture:
        return _AsyncOutputFuture(self.worker.execute(plan))

    def shutdown(self) -> None:
        """Frees the worker's device memory in this process (Worker.shutdown)."""
        self.worker.shutdown()
