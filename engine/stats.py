"""Engine statistics: per-step counters, snapshots, and a periodic log line.

``EngineStats`` (``ipc.engine_messages``) is the snapshot: queue lengths and
KV usage now, counters since the engine started. ``StepCounters`` keeps the
counters the scheduler does not (steps, scheduled and generated tokens).
``StatsLogger`` logs one vLLM-like line every ``interval_s`` seconds from
the difference of two snapshots:

    Avg prompt throughput: 812.0 tokens/s, Avg generation throughput: 97.5
    tokens/s, Running: 12 reqs, Waiting: 3 reqs, KV cache usage: 41.2%,
    Prefix cache hit rate: 25.0%, Preemptions: 0

and, with speculative decoding, over the same interval:

    SpecDecoding metrics: Mean acceptance length: 2.41, Accepted: 310 tokens,
    Drafted: 880 tokens, Avg draft acceptance rate: 35.2%, Per-position
    acceptance rate: 0.61, 0.38, 0.24, 0.18
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ipc.engine_messages import EngineStats
from ipc.lora_request import LoRARequest

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


def snapshot(scheduler, counters: StepCounters, num_admitting: int = 0,
             admitting_loras: Iterable[LoRARequest | None] = ()) -> EngineStats:
    """The engine's state now (``scheduler`` is an ``engine.scheduler.Scheduler``);
    ``num_admitting`` requests not yet handed to the scheduler (being
    admitted by a server) wait as much as those in its queue, and so do
    their adapters (``admitting_loras``: theirs, None for one without), as
    vLLM counts a request's adapter as waiting from its arrival."""
    kv = scheduler.kv
    spec = scheduler.spec_stats
    return EngineStats(
        num_running=scheduler.num_running_reqs,
        num_waiting=scheduler.num_waiting_reqs + num_admitting,
        num_blocks=kv.pool.num_blocks,
        num_free_blocks=kv.pool.num_free_blocks,
        kv_usage=kv.usage,
        prefix_hit_rate=kv.prefix_hit_rate,
        num_preemptions=scheduler.num_preemptions,
        num_steps=counters.num_steps,
        num_prompt_tokens=scheduler.num_prompt_tokens,
        num_generation_tokens=counters.num_generation_tokens,
        num_scheduled_tokens=counters.num_scheduled_tokens,
        prefix_cache_queries=kv.prefix_queries,
        prefix_cache_hits=kv.prefix_hits,
        spec_decode_num_drafts=spec.num_drafts,
        spec_decode_num_draft_tokens=spec.num_draft_tokens,
        spec_decode_num_accepted_tokens=spec.num_accepted_tokens,
        spec_decode_num_accepted_tokens_per_pos=list(spec.num_accepted_tokens_per_pos),
        running_lora_adapters=lora_adapters(r.lora_request for r in scheduler.running),
        waiting_lora_adapters=lora_adapters(
            [*(r.lora_request for r in scheduler.waiting), *admitting_loras]),
    )


def lora_adapters(loras: Iterable[LoRARequest | None]) -> dict[str, int]:
    """Each LoRA adapter's name and how many of ``loras`` (some requests'
    adapters; None: a request without one, not counted) name it, in the
    order the adapters first come among them."""
    return dict(Counter(lora.lora_name for lora in loras if lora is not None))


def spec_decode_summary(prev: EngineStats, now: EngineStats) -> dict | None:
    """Speculative decoding between two snapshots: drafts, accepted tokens,
    acceptance rate, mean acceptance length (tokens a verifying step emits:
    1 + accepted drafts per step) and acceptance rate by draft position; None
    when no draft was verified in between."""
    steps = now.spec_decode_num_drafts - prev.spec_decode_num_drafts
    if steps <= 0:
        return None
    drafted = now.spec_decode_num_draft_tokens - prev.spec_decode_num_draft_tokens
    accepted = now.spec_decode_num_accepted_tokens - prev.spec_decode_num_accepted_tokens
    before = prev.spec_decode_num_accepted_tokens_per_pos or [0] * len(
        now.spec_decode_num_accepted_tokens_per_pos)
    per_pos = [(a - b) / steps for a, b in zip(now.spec_decode_num_accepted_tokens_per_pos,
                                               before)]
    return {"num_drafts": steps, "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / max(drafted, 1),
            "mean_acceptance_length": 1 + accepted / steps,
            "acceptance_rate_per_position": per_pos}


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
    ) + _spec_line(prev, now)


def _spec_line(prev: EngineStats, now: EngineStats) -> str:
    spec = spec_decode_summary(prev, now)
    if spec is None:
        return ""
    per_pos = ", ".join(f"{r:.2f}" for r in spec["acceptance_rate_per_position"])
    return (f"; SpecDecoding metrics: Mean acceptance length: "
            f"{spec['mean_acceptance_length']:.2f}, Accepted: {spec['num_accepted_tokens']} "
            f"tokens, Drafted: {spec['num_draft_tokens']} tokens, Avg draft acceptance rate: "
            f"{100 * spec['acceptance_rate']:.1f}%, Per-position acceptance rate: {per_pos}")


class StatsLogger:
    """Logs ``interval_line`` at INFO every ``interval_s`` seconds, when
    ``maybe_log`` is called (the serving loop calls it every iteration).
    Quiet intervals (no tokens, nothing queued) are not logged.
    ``take_snapshot(num_admitting)``: the engine's snapshot, counting as
    waiting that many requests its caller holds before queueing them."""

    def __init__(self, take_snapshot: Callable[[int], EngineStats],
                 prefix_counts: Callable[[], tuple[int, int]], interval_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if interval_s <= 0:
            raise ValueError(f"the stats interval must be > 0 seconds, got {interval_s}")
        self.take_snapshot = take_snapshot
        self.prefix_counts = prefix_counts
        self.interval_s = interval_s
        self.clock = clock
        self.last_time = clock()
        self.last = take_snapshot(0)
        self.last_prefix = prefix_counts()

    def maybe_log(self, num_admitting: int = 0) -> str | None:
        """The line logged now, or None when the interval has not passed;
        ``num_admitting`` as ``take_snapshot`` takes it."""
        now_time = self.clock()
        if now_time - self.last_time < self.interval_s:
            return None
        now, prefix = self.take_snapshot(num_admitting), self.prefix_counts()
        line = None
        busy = now.num_running or now.num_waiting
        if busy or now.num_scheduled_tokens != self.last.num_scheduled_tokens:
            delta = (prefix[0] - self.last_prefix[0], prefix[1] - self.last_prefix[1])
            line = interval_line(self.last, now, now_time - self.last_time, delta)
            logger.info("%s", line)
        self.last_time, self.last, self.last_prefix = now_time, now, prefix
        return line
