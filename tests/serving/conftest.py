"""Fixtures of the ``AsyncLLM`` modules (``test_async_llm``,
``test_async_llm_fuzz``): an ``AsyncLLM`` of the tiny model on the CPU
and, as its reference, an ``LLM`` of the same model, one each a module.
Their names are their own, so a module's ``llm`` fixture (another
engine) is never shadowed."""

from __future__ import annotations

import pytest

from engine import LLM
from serving.async_llm import AsyncLLM


@pytest.fixture(scope="module")
def async_llm():
    engine = AsyncLLM(model="tiny", device="cpu", seed=0)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def offline_llm():
    with LLM(model="tiny", device="cpu", seed=0) as engine:
        yield engine
