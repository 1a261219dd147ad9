"""When each request of a serving benchmark is sent, as vLLM's ``bench
serve`` schedules them.

``--request-rate`` inf sends every request at once (offset 0). A finite
rate draws each gap between sends from a gamma distribution of shape
``burstiness`` and scale ``1 / (rate * burstiness)`` (mean ``1 / rate``);
burstiness 1 is a Poisson process (exponential gaps), below 1 burstier,
above 1 more even, inf exactly ``1 / rate``. The offsets are the running
sums of the gaps, scaled so that the last one is ``n / rate``: every seed
then sends the run over the same span, and throughput figures do not move
with the draw.

The draws come from numpy's legacy generator seeded with ``--seed`` (the
one vLLM seeds with ``np.random.seed``), so a seed gives the offsets vLLM
gives.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def arrival_offsets(num_requests: int, request_rate: float, burstiness: float,
                    seed: int) -> list[float]:
    """Seconds from the start of the run to each request's send, in
    order, non-decreasing; all 0 for an infinite rate."""
    if num_requests < 1:
        raise ValueError("a benchmark needs at least one request")
    if not request_rate > 0:
        raise ValueError(f"--request-rate must be positive, got {request_rate}")
    if not burstiness > 0:
        raise ValueError(f"--burstiness must be positive, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    if math.isinf(burstiness):
        gaps = [1.0 / request_rate] * num_requests
    else:
        rng = np.random.RandomState(seed)
        scale = 1.0 / (request_rate * burstiness)
        gaps = [float(rng.gamma(shape=burstiness, scale=scale)) for _ in range(num_requests)]
    offsets = list(np.cumsum(gaps))
    if offsets[-1] == 0:
        return [0.0] * num_requests
    stretch = (num_requests / request_rate) / offsets[-1]
    return [float(t) * stretch for t in offsets]


async def arrive(items: Sequence[T], offsets: Sequence[float]) -> AsyncIterator[T]:
    """Yield each item at its offset from the first call (asyncio sleeps;
    an item already late is yielded at once)."""
    start = time.perf_counter()
    for item, offset in zip(items, offsets):
        wait = start + offset - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        yield item
