"""Fixtures the engine tests share."""

from __future__ import annotations

import pytest

import executor.multiproc
import executor.uniproc


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
