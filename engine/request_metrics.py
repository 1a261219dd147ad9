"""``RequestOutput.metrics``: vLLM's ``RequestStateStats``, the times of a
request and how many tokens it generated.

Clocks are vLLM's: ``arrival_time`` is wall-clock seconds (``time.time()``),
the ``*_ts`` fields are ``time.monotonic()`` of the process that built the
output, and ``first_token_latency`` is the seconds from arrival to the first
token. ``RequestTimes`` takes one engine request's times as the process
reading its deltas sees them (an ``LLM`` as its engine absorbs each step,
an ``EngineClient`` as it receives each delta); ``request_stats`` joins the
times of a prompt's ``n`` engine requests: the first arrival, queueing,
scheduling and first token, the last token, the tokens of every output
(``RequestStateStats`` says why this differs from vLLM for ``n`` > 1).
A time nobody saw is None: ``queued_ts`` and ``scheduled_ts`` are the
engine's own moments, known where the engine runs in the same process
(``LLM``), not to a client over IPC; a request that ended before any token
(aborted) has no token times.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class RequestStateStats:
    """vLLM's names. ``queued_ts``: when the scheduler queued the request;
    ``scheduled_ts``: when it was first scheduled (a preemption does not
    move it); ``num_generation_tokens``: the tokens of the outputs, summed
    over all ``n`` of them, so that it is always ``sum(len(o.token_ids)
    for o in output.outputs)``.

    The rule for ``n`` > 1, and why it is not vLLM's: vLLM runs each of a
    prompt's ``n`` choices as a child request with stats of its own, and
    the joined ``RequestOutput`` carries the stats of whichever child
    finished last: its own token count and times, an order-dependent
    answer that describes one choice of the ``n``. Here the stats describe
    the whole output: the first arrival, the earliest first token, the
    latest last token, and every choice's tokens. These stats are for the
    caller alone: the Prometheus token counters (``engine/stats.py``,
    ``StepCounters``) count the tokens each engine step generated, once
    each, and never read them."""

    arrival_time: float
    num_generation_tokens: int = 0
    queued_ts: float | None = None
    scheduled_ts: float | None = None
    first_token_ts: float | None = None
    last_token_ts: float | None = None
    first_token_latency: float | None = None


class RequestTimes:
    """One engine request's arrival (both clocks, taken at construction)
    and the monotonic times its first and last tokens came."""

    def __init__(self) -> None:
        self.arrival_time = time.time()
        self.arrival_ts = time.monotonic()
        self.queued_ts: float | None = None
        self.scheduled_ts: float | None = None
        self.first_token_ts: float | None = None
        self.last_token_ts: float | None = None

    def tokens_at(self, now: float) -> float | None:
        """Tokens came at ``now``: the seconds since the tokens before them,
        None for the first ones."""
        last, self.last_token_ts = self.last_token_ts, now
        if last is None:
            self.first_token_ts = now
            return None
        return now - last

    @property
    def first_token_latency(self) -> float | None:
        if self.first_token_ts is None:
            return None
        return self.first_token_ts - self.arrival_ts


def request_stats(times: Sequence[RequestTimes], num_generation_tokens: int) -> RequestStateStats:
    """The stats of one prompt's engine requests (``times``, one each)."""
    first = min(times, key=lambda t: t.arrival_ts)
    first_token = _earliest(t.first_token_ts for t in times)
    last_tokens = [t.last_token_ts for t in times if t.last_token_ts is not None]
    return RequestStateStats(
        arrival_time=first.arrival_time,
        num_generation_tokens=num_generation_tokens,
        queued_ts=_earliest(t.queued_ts for t in times),
        scheduled_ts=_earliest(t.scheduled_ts for t in times),
        first_token_ts=first_token,
        last_token_ts=max(last_tokens, default=None),
        first_token_latency=None if first_token is None else first_token - first.arrival_ts,
    )


def _earliest(values) -> float | None:
    return min((v for v in values if v is not None), default=None)
