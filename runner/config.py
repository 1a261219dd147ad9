"""The runner's configuration: ``RunnerConfig``, built and checked by the
engine's ``EngineConfig.runner_config`` and received typed by each worker.
It lives in ``ipc.config`` because the engine builds it and the runner may
import nothing of the engine; this name is where the runner reads it."""

from ipc.config import RunnerConfig

__all__ = ["RunnerConfig"]
