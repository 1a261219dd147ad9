"""TP=1 in process: the engine's thread runs the worker directly.

Failures mean what they mean from a worker daemon: a plan the runner
rejects before applying any of it is a ``StepRejected`` (the engine goes
on); any other exception of a step is a ``WorkerFailure`` naming rank 0,
after which every step fails at once (the runner's state may be half
updated, as a daemon's would be when it dies).

A step with constrained requests runs its forward pass when its plan comes
(``execute_model``) and samples when its bitmask comes (``sample_tokens``);
its future resolves after that. Plans and bitmasks run in the order a
worker daemon runs them (``worker.step_order``): a plan that comes while a
bitmask is due runs once that step has sampled, inside ``sample_tokens``.
Rejections reach the step's future (``StepRejected`` from ``result()``), as
they do from a daemon.
"""

from __future__ import annotations

import traceback
from typing import Any

from executor.base import Executor, StepRejected, WorkerFailure
from ipc.errors import InvalidPlanError
from ipc.messages import GrammarBitmask, ModelRunnerOutput, SchedulerOutput
from worker.env import TorchrunEnv
from worker.step_order import StepOrder
from worker.worker import Worker


class _AsyncOutputFuture:
    """Resolves by calling ``get_output()``: the only wait on the device.
    Before its step has sampled (a bitmask still to come, or a plan kept
    until the step before it samples) it has no ``async_output``;
    ``error`` is the step's failure, raised by ``result``."""

    def __init__(self, step_id: int):
        self.step_id = step_id
        self.async_output = None
        self.error: Exception | None = None
        self.output: ModelRunnerOutput | None = None

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        if self.error is not None:
            raise self.error
        if self.async_output is None:
            raise RuntimeError(f"step {self.step_id} has not sampled (its grammar bitmask, "
                               "or the one of the step before it, was not sent)")
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
        self.futures: dict[int, _AsyncOutputFuture] = {}  # steps not sampled yet
        self.order = StepOrder(self._forward, self._sample, self._reject)

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None,
                       timeout: float | None = 300.0) -> list[Any]:
        return [self.worker.call(method, kwargs or {})]

    def execute_model(self, plan: SchedulerOutput) -> _AsyncOutputFuture:
        self.check_health()
        future = self.futures[plan.step_id] = _AsyncOutputFuture(plan.step_id)
        self.order.on_plan(plan)
        return future

    def sample_tokens(self, grammar: GrammarBitmask) -> None:
        self.check_health()
        self.order.on_bitmask(grammar)

    def check_health(self) -> None:
        if self.failure is not None:
            raise WorkerFailure(self.failure)

    # ---- StepOrder's callbacks ---------------------------------------------
    def _forward(self, plan: SchedulerOutput) -> bool:
        return self._run(plan.step_id, self.worker.execute_model, plan)[0]

    def _sample(self, step_id: int, grammar: GrammarBitmask | None) -> None:
        ok, async_output = self._run(step_id, self.worker.sample_tokens, grammar)
        future = self.futures.pop(step_id, None)
        if ok and future is not None:
            future.async_output = async_output

    def _reject(self, step_id: int, reason: str) -> None:
        future = self.futures.pop(step_id, None)
        if future is not None:
            future.error = StepRejected(f"step {step_id} rejected by rank 0: {reason}")

    def _run(self, step_id: int, call, arg) -> tuple[bool, Any]:
        """``(True, call(arg))``; a plan or bitmask the runner refuses before
        applying any of it rejects the step (``_reject``); any other failure
        is the worker's (every later call raises it)."""
        try:
            return True, call(arg)
        except InvalidPlanError as e:  # nothing applied
            self._reject(step_id, str(e))
            return False, None
        except Exception as e:
            self.failure = (f"worker rank 0 (in process) failed step {step_id}:\n"
                            f"{traceback.format_exc()}")
            raise WorkerFailure(self.failure) from e

    def shutdown(self) -> None:
        """Frees the worker's device memory in this process (Worker.shutdown)."""
        self.worker.shutdown()
