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

Under a ramp-up (``ramp_up``) each gap is drawn at its own request's rate
(``RampUp.rate``) and the offsets are the gaps' plain running sums, not
stretched: the span follows from the ramp.

The draws come from numpy's legacy generator seeded with ``--seed`` (the
one vLLM seeds with ``np.random.seed``), one gamma draw per request in
order, so a seed gives the offsets vLLM gives.

``arrive`` waits for each offset on a clock and a sleep it is given
(``time.perf_counter`` and ``asyncio.sleep`` by default), so that its
schedule can be checked on a fake clock.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

import numpy as np

from launch.bench_serve.ramp_up import RampUp

T = TypeVar("T")


def arrival_offsets(num_requests: int, request_rate: float, burstiness: float,
                    seed: int, ramp_up: RampUp | None = None) -> list[float]:
    """Seconds from the start of the run to each request's send, in
    order, non-decreasing; all 0 for an infinite rate (without a ramp)."""
    if ramp_up is not None:
        return ramped_offsets(ramp_up.rates(num_requests), burstiness, seed)
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


def ramped_offsets(rates: Sequence[float], burstiness: float, seed: int) -> list[float]:
    """The running sums of one gap per request, each drawn at that
    request's rate (``1 / rate`` exactly for an infinite burstiness)."""
    if not rates:
        raise ValueError("a benchmark needs at least one request")
    if not burstiness > 0:
        raise ValueError(f"--burstiness must be positive, got {burstiness}")
    if not all(0 < r < math.inf for r in rates):
        raise ValueError(f"every ramped rate must be positive and finite, got {list(rates)}")
    if math.isinf(burstiness):
        gaps = [1.0 / r for r in rates]
    else:
        rng = np.random.RandomState(seed)
        gaps = [float(rng.gamma(shape=burstiness, scale=1.0 / (r * burstiness)))
                for r in rates]
    return [float(t) for t in np.cumsum(gaps)]


async def arrive(items: Sequence[T], offsets: Sequence[float],
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 ) -> AsyncIterator[T]:
    """Yield each item at its offset from the first call (an item already
    late is yielded at once)."""
    start = clock()
    for item, offset in zip(items, offsets):
        wait = start + offset - clock()
        if wait > 0:
            await sleep(wait)
        yield item
