"""Probe requests beside a serving benchmark's load (vLLM's
``--probe-request-rate``): while the measured run goes on, one request
of a one-token prompt (``"Hi"``) asking for one token, then a pause of
``1 / rate`` seconds, then the next, until the run's last request ends.
Probes bypass ``--max-concurrency`` (their own connection: vLLM's share
the run's pool, capped at that limit, so they queue behind the load) and
are not part of the run's
metrics: their end-to-end latencies show how long the load makes an
unrelated short request wait (the stall a user of the server sees).

A probe is sent only after the one before it ended, so at most one is
in flight; the run's duration ends at its last measured request, a probe
still in flight then excluded (vLLM's also waits for that probe and its
pause, which stretches the duration its throughputs divide by).

The result, as vLLM names it, only when some probe succeeded:
``probe_completed``, ``probe_failed``, ``probe_median_e2el_ms``,
``probe_p99_e2el_ms``, ``probe_max_e2el_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import numpy as np

from launch.bench_serve.request import RequestOutput


async def probe_loop(send: Callable[[], Awaitable[RequestOutput]], rate: float,
                     stop: asyncio.Event) -> list[RequestOutput]:
    """Each probe's output, in order: ``send()`` then a pause of ``1 /
    rate`` s, until ``stop`` is set (a pause ends as soon as it is)."""
    outputs = []
    while not stop.is_set():
        outputs.append(await send())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0 / rate)
    return outputs


def probe_stats(outputs: list[RequestOutput]) -> dict[str, float] | None:
    """vLLM's probe fields (milliseconds), or None when no probe succeeded."""
    latencies = np.asarray([o.latency for o in outputs if o.success], dtype=float) * 1000
    if not len(latencies):
        return None
    return {"probe_completed": len(latencies), "probe_failed": len(outputs) - len(latencies),
            "probe_median_e2el_ms": float(np.median(latencies)),
            "probe_p99_e2el_ms": float(np.percentile(latencies, 99)),
            "probe_max_e2el_ms": float(latencies.max())}
