"""The executor interface the engine drives."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from ipc.config import RunnerConfig
from ipc.messages import GrammarBitmask, ModelRunnerOutput, SchedulerOutput


class WorkerFailure(RuntimeError):
    """A worker died or failed a step; the message names the rank."""


class StepRejected(ValueError):
    """Every rank rejected a step's plan before applying any of it; the
    workers keep serving."""


class OutputFuture(Protocol):
    def result(self, timeout: float | None = None) -> ModelRunnerOutput: ...


class Executor(ABC):
    world_size: int

    @abstractmethod
    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None,
                       timeout: float | None = 300.0) -> list[Any]:
        """Run a control method on every rank; results in rank order."""

    @abstractmethod
    def execute_model(self, plan: SchedulerOutput) -> OutputFuture:
        """Send one step; the future resolves to the output rank's reply.
        A plan with ``structured_output_req_ids`` resolves only after its
        ``sample_tokens``. The next plan may be sent before that bitmask (at
        most one plan ahead of it): the workers run it once the step before
        it has sampled (``worker.step_order``)."""

    @abstractmethod
    def sample_tokens(self, grammar: GrammarBitmask) -> None:
        """Send the grammar bitmask of a step already sent whose plan has
        ``structured_output_req_ids``; the workers then sample it. A bitmask
        that does not fit the step rejects it (its future raises
        ``StepRejected``)."""

    @abstractmethod
    def check_health(self) -> None:
        """Raise the ``WorkerFailure`` that ended the workers (a dead or
        failed rank, named), if one has; nothing otherwise. Cheap: callers
        that send no step for a while (an idle server) ask it each turn."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker; leave no process or socket behind."""

    def initialize(self, runner_config: RunnerConfig, num_blocks_override: int | None,
                   check_blocks: Callable[[int], None] | None = None) -> int:
        """Load the model on every rank and size the KV cache; returns the
        number of blocks (the minimum over ranks, unless overridden).
        ``check_blocks(num_blocks)`` raises where the caller cannot use that
        many (the engine's rule: a cache too small for one request, none at
        all included); it runs before any cache is allocated."""
        self.collective_rpc("load_model", {"config": runner_config}, timeout=600)
        if num_blocks_override is not None:
            num_blocks = num_blocks_override
        else:
            num_blocks = min(self.collective_rpc("determine_num_blocks", timeout=600))
        if check_blocks is not None:
            check_blocks(num_blocks)
        self.collective_rpc("init_kv_cache", {"num_blocks": num_blocks}, timeout=600)
        return num_blocks
