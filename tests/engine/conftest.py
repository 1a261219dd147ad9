"""Fixtures the engine tests share."""

from __future__ import annotations

import pytest

import executor.multiproc
import executor.uniproc
from tests.helpers.hf_models import save_classifier, save_embedding_llama


@pytest.fixture
def no_workers(monkeypatch):
    """The names of the executors that tried to start; any that does fails
    the test with ``AssertionError`` (a test of a bad config expects none;
    one that reaches it learns that every check before it passed)."""
    started = []

    def refuse(self, *args, **kwargs):
        started.append(type(self).__name__)
        raise AssertionError("an executor started")

    monkeypatch.setattr(executor.multiproc.MultiprocExecutor, "__init__", refuse)
    monkeypatch.setattr(executor.uniproc.UniprocExecutor, "__init__", refuse)
    return started


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    """A small embedding Llama's checkpoint (``save_embedding_llama``)."""
    return save_embedding_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A small sequence classifier's checkpoint, three labels."""
    return save_classifier(tmp_path_factory.mktemp("cls"), num_labels=3)
