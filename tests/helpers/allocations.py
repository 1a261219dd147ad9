"""How much memory a piece of streamed work allocates, counted by
``tracemalloc`` (allocations, not time: no clock is read, so a test on it
does not depend on the machine's load). ``Allocations.piece`` measures one
piece: what it allocates beyond what was held before it, at its peak;
``total`` sums the pieces. Work that copies the text so far at each piece
allocates the square of the text's length over an answer; work that keeps
its pieces, their length. ``held_by`` counts what a piece of work leaves
held: the memory of what it built and still references."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


class Allocations:
    def __init__(self) -> None:
        self.total = 0

    @contextmanager
    def tracing(self) -> Iterator[Allocations]:
        """Allocations are traced inside (and ``piece`` measures only there)."""
        tracemalloc.start()
        try:
            yield self
        finally:
            tracemalloc.stop()

    @contextmanager
    def piece(self) -> Iterator[None]:
        """Adds to ``total`` the peak the work inside allocates beyond what
        was held when it began. Around a ``yield`` of a generator, it
        measures the consumer's work on what was yielded."""
        tracemalloc.reset_peak()
        held = tracemalloc.get_traced_memory()[0]
        yield
        self.total += tracemalloc.get_traced_memory()[1] - held


def held_by(build: Callable[[], T]) -> tuple[T, int]:
    """What ``build()`` returns, and the memory (traced) still held once it
    has returned: what it built and did not let go."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built = build()
        return built, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
