"""TP=1 in process: the engine's thread runs the worker directly.

Failures mean what they mean from a worker daemon: a plan the runner
rejects before applying any of it is a ``StepRejected`` (the engine goes
on); any other exception of a step is a ``WorkerFailure`` naming rank 0,
after which every step fails at once (the runner's state may be half
updated, as a daemon's would be when it dies).
"""

from __future__ import annotations

import traceback
from typing import Any

from executor.base import Executor, StepRejected, WorkerFailure
from ipc.errors import InvalidPlanError
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
        self.failure: str | None = None

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None,
                       timeout: float = 300.0) -> list[Any]:
        return [self.worker.call(method, kwargs or {})]

    def execute_model(self, plan: SchedulerOutput) -> _AsyncOutputFuture:
        if self.failure is not None:
            raise WorkerFailure(self.failure)
        try:
            return _AsyncOutputFuture(self.worker.execute(plan))
        except InvalidPlanError as e:  # nothing applied
            raise StepRejected(f"step {plan.step_id} rejected by rank 0: {e}") from e
        except Exception as e:
            self.failure = (f"worker rank 0 (in process) failed step {plan.step_id}:\n"
                            f"{traceback.format_exc()}")
            raise WorkerFailure(self.failure) from e

    def shutdown(self) -> None:
        """Frees the worker's device memory in this process (Worker.shutdown)."""
        self.worker.shutdown()
