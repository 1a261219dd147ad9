"""TP=1 in process: the engine's thread runs the worker directly.

Failures mean what they mean from a worker daemon: a plan the runner
rejects before applying any of it is a ``StepRejected`` (the engine goes
on); any other exception of a step is a ``WorkerFailure`` naming rank 0,
after which every step fails at once (the runner's state may be half
updated, as a daemon's would be when it dies).

A step with constrained requests runs its forward pass in ``execute_model``
and samples in ``sample_tokens(bitmask)``; its future resolves after that.
"""

from __future__ import annotations

import traceback
from typing import Any

from executor.base import Executor, StepRejected, WorkerFailure
from ipc.errors import InvalidPlanError
from ipc.messages import GrammarBitmask, ModelRunnerOutput, SchedulerOutput
from worker.env import TorchrunEnv
from worker.worker import Worker


class _AsyncOutputFuture:
    """Resolves by calling ``get_output()``: the only wait on the device.
    Before its step has sampled (a bitmask still to come) it has no
    ``async_output``; ``error`` is the step's failure, raised by ``result``."""

    def __init__(self, step_id: int, async_output=None):
        self.step_id = step_id
        self.async_output = async_output
        self.error: Exception | None = None
        self.output: ModelRunnerOutput | None = None

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        if self.error is not None:
            raise self.error
        if self.async_output is None:
            raise RuntimeError(f"step {self.step_id} waits for its grammar bitmask "
                               "(sample_tokens was not called)")
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
        self.awaiting: _AsyncOutputFuture | None = None  # a step waiting for its bitmask

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None,
                       timeout: float = 300.0) -> list[Any]:
        return [self.worker.call(method, kwargs or {})]

    def execute_model(self, plan: SchedulerOutput) -> _AsyncOutputFuture:
        if self.failure is not None:
            raise WorkerFailure(self.failure)
        if self.awaiting is not None:
            self.awaiting.error = StepRejected(
                f"step {self.awaiting.step_id} rejected by rank 0: step {plan.step_id} came "
                "before its grammar bitmask")
            self.awaiting = None
        future = _AsyncOutputFuture(plan.step_id)
        self._run(plan.step_id, self.worker.execute_model, plan)
        if plan.structured_output_req_ids:
            self.awaiting = future
        else:
            future.async_output = self._run(plan.step_id, self.worker.sample_tokens, None)
        return future

    def sample_tokens(self, grammar: GrammarBitmask) -> None:
        if self.failure is not None:
            raise WorkerFailure(self.failure)
        future, self.awaiting = self.awaiting, None
        if future is None or future.step_id != grammar.step_id:
            self.awaiting = future
            raise StepRejected(f"step {grammar.step_id} rejected by rank 0: no step waits "
                               "for this grammar bitmask")
        try:
            future.async_output = self._run(grammar.step_id, self.worker.sample_tokens, grammar)
        except StepRejected as e:
            future.error = e

    def _run(self, step_id: int, call, arg):
        """One of the step's calls; its failures as a daemon's would be reported."""
        try:
            return call(arg)
        except InvalidPlanError as e:  # nothing applied
            raise StepRejected(f"step {step_id} rejected by rank 0: {e}") from e
        except Exception as e:
            self.failure = (f"worker rank 0 (in process) failed step {step_id}:\n"
                            f"{traceback.format_exc()}")
            raise WorkerFailure(self.failure) from e

    def shutdown(self) -> None:
        """Frees the worker's device memory in this process (Worker.shutdown)."""
        self.worker.shutdown()
