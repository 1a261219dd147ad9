"""The order and the count of a file dataset's requests, as vLLM draws
them: its seeded shuffle of the file's entries, and its oversampling of a
dataset with fewer requests than ``--num-prompts``.

Both draw from Python's ``random`` generator seeded afresh, as vLLM's
``random.seed(seed)`` followed by ``random.shuffle`` / ``random.choice``:
a ``random.Random(seed)`` of its own here (the same draws, without
touching the process's global generator), so a seed gives vLLM's order
and vLLM's extra requests.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TypeVar

from launch.bench_serve.random_dataset import SampleRequest

T = TypeVar("T")


def shuffled(items: list[T], seed: int, shuffle: bool = True) -> list[T]:
    """A copy of ``items``, shuffled by ``seed`` unless ``shuffle`` is
    False (vLLM's ``--disable-shuffle``: the file's order)."""
    order = list(items)
    if shuffle:
        random.Random(seed).shuffle(order)
    return order


def oversampled(requests: list[SampleRequest], num_prompts: int, seed: int,
                request_id_prefix: str) -> list[SampleRequest]:
    """``requests`` followed by ``num_prompts - len(requests)`` of them
    drawn with replacement (none when there are enough), request ids
    continuing the count: vLLM's oversampling."""
    draws = random.Random(seed)
    extra = [replace(draws.choice(requests),
                     request_id=f"{request_id_prefix}{len(requests) + i}")
             for i in range(num_prompts - len(requests))]
    return requests + extra
