"""Models and runner configurations as the engine makes them: described
once by ``checkpoint.description``, configured through ``EngineConfig`` (the
one place a default lives)."""

from __future__ import annotations

from checkpoint.description import describe
from engine.config import EngineConfig
from ipc.config import RunnerConfig


def runner_config(model_dir: str, **settings) -> RunnerConfig:
    """The ``RunnerConfig`` the engine would send for ``model_dir``;
    ``settings`` are ``EngineConfig`` fields (device: "cpu" unless given)."""
    config = EngineConfig(model=model_dir, **{"device": "cpu", **settings})
    return config.runner_config(model_dir, describe(model_dir))


def build_model_from_dir(model_dir: str, dtype, device, tp, attention_backend=None):
    """The model of ``model_dir`` with this rank's weights, as a worker builds it."""
    from runner.models import build_model

    return build_model(describe(model_dir), model_dir, dtype, device, tp, attention_backend)
