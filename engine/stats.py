"""Engine statistics: per-step counters, snapshots, and a periodic log line.

``EngineStats`` (``ipc.engine_messages``) is the snapshot: queue lengths and
KV usage now, counters since the engine started. ``StepCounters`` keeps the
counters the scheduler does not (steps, scheduled and generated tokens).
``StatsLogger`` logs one vLLM-like line every ``interval_s`` seconds from
the difference of two snapshots:

    Avg prompt throughput: 812.0 tokens/s, Avg generation throughput: 97.5
    tokens/s, Running: 12 reqs, Waiting: 3 reqs, KV cache usage: 41.2%,
    Prefix cache hit rate: 25.0%, Preemptions: 0
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ipc.engine_messages import EngineStats

logger = logging.getLogger("tprun.stats")


@dataclass
class StepCounters:
    """Counts of every step an engine has absorbed since it started."""

    num_steps: int = 0
    num_scheduled_tokens: int = 0
    num_generation_tokens: int = 0

    def on_step(self, num_scheduled_tokens: int, num_generated_tokens: int) -> None:
        self.num_steps += 1
        self.num_scheduled_tokens += num_scheduled_tokens
        self.num_generation_tokens += num_generated_tokens


def snapshot(scheduler, counters: StepCounters) -> EngineStats:
    """The engine's state now (``scheduler`` is an ``engine.scheduler.Scheduler``)."""
    kv = scheduler.kv
    return EngineStats(
        num_running=scheduler.num_running_reqs,
        num_waiting=scheduler.num_waiting_reqs,
        num_blocks=kv.pool.num_blocks,
        num_free_blocks=kv.pool.num_free_blocks,
        kv_usage=kv.usage,
        prefix_hit_rate=kv.prefix_hit_rate,
        num_preemptions=scheduler.num_preemptions,
        num_steps=counters.num_steps,
        num_prompt_tokens=scheduler.num_prompt_tokens,
        num_generation_tokens=counters.num_generation_tokens,
        num_scheduled_tokens=counters.num_scheduled_tokens,
    )


def interval_line(prev: EngineStats, now: EngineStats, elapsed_s: float,
                  prefix: tuple[int, int] = (0, 0)) -> str:
    """The log line for the interval between two snapshots. ``prefix`` is
    (hit tokens, queried tokens) in the interval; without lookups the
    cumulative hit rate is shown."""
    elapsed_s = max(elapsed_s, 1e-9)
    prompt_tps = (now.num_prompt_tokens - prev.num_prompt_tokens) / elapsed_s
    gen_tps = (now.num_generation_tokens - prev.num_generation_tokens) / elapsed_s
    hits, queries = prefix
    hit_rate = hits / queries if queries else now.prefix_hit_rate
    return (
        f"Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
        f"Avg generation throughput: {gen_tps:.1f} tokens/s, "
        f"Running: {now.num_running} reqs, Waiting: {now.num_waiting} reqs, "
        f"KV cache usage: {100 * now.kv_usage:.1f}%, "
        f"Prefix cache hit rate: {100 * hit_rate:.1f}%, "
        f"Preemptions: {now.num_preemptions - prev.num_preemptions}"
    )


class StatsLogger:
    """Logs ``interval_line`` at INFO every ``interval_s`` seconds, when
    ``maybe_log`` is called (the serving loop calls it every iteration).
    Quiet intervals (no tokens, nothing queued) are not logged."""

    def __init__(self, take_snapshot: Callable[[], EngineStats],
                 prefix_counts: Callable[[], tuple[int, int]], interval_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if interval_s <= 0:
            raise ValueError(f"the stats interval must be > 0 seconds, got {interval_s}")
        self.take_snapshot = take_snapshot
        self.prefix_counts = prefix_counts
        self.interval_s = interval_s
        self.clock = clock
        self.last_time = clock()
        self.last = take_snapshot()
        self.last_prefix = prefix_counts()

    def maybe_log(self) -> str | None:
        """The line logged now, or None when the interval has not passed."""
        now_time = self.clock()
        if now_time - self.last_time < self.interval_s:
            return None
        now, prefix = self.take_snapshot(), self.prefix_counts()
        line = None
        busy = now.num_running or now.num_waiting
        if busy or now.num_scheduled_tokens != self.last.num_scheduled_tokens:
            delta = (prefix[0] - self.last_prefix[0], prefix[1] - self.last_prefix[1])
            line = interval_line(self.last, now, now_time - self.last_time, delta)
            logger.info("%s", line)
        self.last_time, self.last, self.last_prefix = now_time, now, prefix
        return line
