"""The statistics of a serving benchmark, as vLLM's ``bench serve``
defines them (every time in milliseconds on the way out).

Over successful requests only:
- TTFT: send to the first token chunk.
- TPOT (time per output token, the first excluded): ``(E2EL - TTFT) /
  (output_tokens - 1)`` of each request with more than one output token.
- ITL: every gap between consecutive token chunks, all requests pooled.
- E2EL: send to the last token chunk.
Each as mean, median, standard deviation (numpy's, population) and the
``--metric-percentiles`` (numpy's linear interpolation); no values at
all gives 0 for each. Throughputs divide by the run's duration;
``output_tokens`` of a request is the server's usage count, or the
tokenizer's count of its text where the server gave none. Goodput counts
the requests within every ``--goodput`` limit (ms; TPOT 0 for a request
of one token).

Peak output throughput: output chunks bucketed by whole seconds from the
first send, the fullest bucket. Peak concurrency: the most requests in
flight at one instant, each in flight over [send, end).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from launch.bench_serve.request import RequestOutput

# The request-level metrics --goodput may limit.
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class Distribution:
    """A metric's summary, in milliseconds."""

    mean: float
    median: float
    std: float
    percentiles: list[tuple[float, float]]


def distribution(seconds: Sequence[float], percentiles: Sequence[float]) -> Distribution:
    values = np.asarray(seconds if len(seconds) else [0.0], dtype=float) * 1000
    return Distribution(float(np.mean(values)), float(np.median(values)), float(np.std(values)),
                        [(p, float(np.percentile(values, p))) for p in percentiles])


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float
    output_throughput: float
    total_token_throughput: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    # Per request, in order; 0 for a failed one.
    output_lens: list[int]


def tpot(output_tokens: int, ttft: float, latency: float) -> float | None:
    """Seconds per output token after the first; None for one token or none."""
    return (latency - ttft) / (output_tokens - 1) if output_tokens > 1 else None


def calculate_metrics(outputs: Sequence[RequestOutput], duration_s: float,
                      count_tokens: Callable[[str], int], percentiles: Sequence[float],
                      goodput: dict[str, float] | None = None) -> BenchmarkMetrics:
    ok = [o for o in outputs if o.success]
    output_lens = [(o.output_tokens or count_tokens(o.generated_text)) if o.success else 0
                   for o in outputs]
    ok_lens = [n for o, n in zip(outputs, output_lens) if o.success]
    tpots = [tpot(n, o.ttft, o.latency) for o, n in zip(ok, ok_lens)]
    total_input, total_output = sum(o.prompt_len for o in ok), sum(output_lens)
    good = _good_requests(ok, [t or 0.0 for t in tpots], goodput or {})
    return BenchmarkMetrics(
        completed=len(ok), failed=len(outputs) - len(ok), total_input=total_input,
        total_output=total_output, request_throughput=len(ok) / duration_s,
        request_goodput=good / duration_s, output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        ttft=distribution([o.ttft for o in ok], percentiles),
        tpot=distribution([t for t in tpots if t is not None], percentiles),
        itl=distribution([gap for o in ok for gap in o.itl], percentiles),
        e2el=distribution([o.latency for o in ok], percentiles),
        max_output_tokens_per_s=peak_output_rate(ok),
        max_concurrent_requests=peak_concurrency(ok), output_lens=output_lens)


def _good_requests(ok: Sequence[RequestOutput], tpots: list[float],
                   limits_ms: dict[str, float]) -> int:
    if not limits_ms:
        return 0
    good = 0
    for o, t in zip(ok, tpots):
        seconds = {"ttft": o.ttft, "tpot": t, "e2el": o.latency}
        good += all(seconds[name] <= ms / 1000 for name, ms in limits_ms.items())
    return good


def peak_output_rate(ok: Sequence[RequestOutput]) -> float:
    """The most token chunks that arrived within one whole second from the
    first send (buckets [k, k+1) s); 0 without a successful request."""
    if not ok:
        return 0.0
    first = min(o.start_time for o in ok)
    buckets: dict[int, int] = {}
    for o in ok:
        arrival = o.start_time + o.ttft
        for gap in [0.0, *o.itl]:
            arrival += gap
            buckets[int(arrival - first)] = buckets.get(int(arrival - first), 0) + 1
    return float(max(buckets.values()))


def peak_concurrency(ok: Sequence[RequestOutput]) -> int:
    """The most requests in flight at one instant, each over [start, end):
    one that ends as another starts does not overlap it."""
    events = sorted([(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1)
                                                         for o in ok])
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak
