"""The request-rate ramp-up of a serving benchmark (vLLM's
``--ramp-up-strategy``, ``--ramp-up-start-rps``, ``--ramp-up-end-rps``):
instead of one ``--request-rate``, each request has its own rate, rising
from the start rate at the first request to the end rate at the last.

Request ``i`` of ``n`` is at progress ``p = i / max(n - 1, 1)`` (0 for the
first, 1 for the last; a run of one request stays at the start rate):

- linear: ``start + (end - start) * p``;
- exponential: ``start * (end / start) ** p``.

Each request's gap to the one before it is drawn at its own rate (the
gamma of ``arrivals``, ``--burstiness`` as with a fixed rate), so the
first request too waits one gap. A ramped run's offsets are the plain
running sums of those gaps: unlike a fixed rate, nothing stretches them
to a planned span.

The rates are whole requests per second, as vLLM's; ``--request-rate``
stays at its default (inf) under a ramp (the two are exclusive), the
start is at most the end, and every request's rate is positive: a start
of 0 is refused for both strategies (vLLM refuses it for exponential and
stops at the first request of a linear one, after the warm-up; here it
is the one error line before anything starts). ``--ramp-up-start-rps``
or ``--ramp-up-end-rps`` without a strategy is refused too (vLLM ignores
them), since a run at ``--request-rate`` is not what such a user asked
for.

``RpsChanges`` keeps vLLM's record of the ramp in the result JSON
(``rps_change_events``): the start rate at the start of the run, then,
each time a request's whole rate (rounded down) passes the last one
recorded, one event per whole rate passed, stamped with that request's
send time (ISO 8601, local).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

STRATEGIES = ("linear", "exponential")


@dataclass(frozen=True)
class RampUp:
    """A checked ramp: ``0 < start_rps <= end_rps``."""

    strategy: str
    start_rps: int
    end_rps: int

    def rate(self, index: int, total: int) -> float:
        """The rate (requests per second) of request ``index`` of ``total``."""
        progress = index / max(total - 1, 1)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * progress
        return self.start_rps * (self.end_rps / self.start_rps) ** progress

    def rates(self, total: int) -> list[float]:
        return [self.rate(i, total) for i in range(total)]


def ramp_up_from_args(strategy: str | None, start_rps: int | None, end_rps: int | None,
                      request_rate: float) -> RampUp | None:
    """The ramp the options ask for (None: a fixed ``--request-rate``);
    ValueError naming the option for a combination that cannot run."""
    if strategy is None:
        given = [name for name, value in (("--ramp-up-start-rps", start_rps),
                                          ("--ramp-up-end-rps", end_rps)) if value is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise ValueError(f"{' and '.join(given)} {verb} only with --ramp-up-strategy "
                             f"({' or '.join(STRATEGIES)})")
        return None
    if strategy not in STRATEGIES:
        raise ValueError(f"--ramp-up-strategy must be one of {', '.join(STRATEGIES)}, got "
                         f"{strategy!r}")
    if not math.isinf(request_rate):
        raise ValueError("--ramp-up-strategy sets the request rate of every request: leave "
                         f"out --request-rate (got {request_rate:g})")
    if start_rps is None or end_rps is None:
        raise ValueError("--ramp-up-strategy needs both --ramp-up-start-rps and "
                         "--ramp-up-end-rps")
    if start_rps < 0 or end_rps < 0:
        raise ValueError(f"--ramp-up-start-rps and --ramp-up-end-rps must be at least 0, got "
                         f"{start_rps} and {end_rps}")
    if start_rps > end_rps:
        raise ValueError(f"--ramp-up-start-rps ({start_rps}) must be at most "
                         f"--ramp-up-end-rps ({end_rps})")
    if start_rps == 0:
        raise ValueError(f"--ramp-up-start-rps must be at least 1: the first request of a "
                         f"{strategy} ramp is sent at the start rate, and 0 requests per "
                         "second sends none")
    return RampUp(strategy, start_rps, end_rps)


@dataclass
class RpsChanges:
    """vLLM's ``rps_change_events``: ``start(rps, stamp)`` once as the run
    starts, ``sent(rate, stamp)`` at each request's send, in order."""

    events: list[dict] = field(default_factory=list)
    _last: int = -1

    def start(self, rps: int, stamp: str) -> None:
        self._last = rps
        self.events.append({"rps": rps, "timestamp": stamp})

    def sent(self, rate: float, stamp: str) -> None:
        whole = int(rate)
        self.events += [{"rps": r, "timestamp": stamp} for r in range(self._last + 1, whole + 1)]
        self._last = max(self._last, whole)
