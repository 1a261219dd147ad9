"""What a serving benchmark prints and saves, in vLLM's ``bench serve``
layout: the summary table (50 columns: labels padded to 40, values to
10, two decimals for rates and times), and the result JSON with vLLM's
field names.

The table: request counts, the concurrency limit and request rate when
set, the duration, token totals and throughputs, the probe requests'
latencies with ``--probe-request-rate``, then one block per
``--percentile-metrics`` entry (ttft, tpot, itl, e2el; client_queue_time
with --max-concurrency; e2el_including_client_queue with it and a finite
rate): mean, median and each percentile, ``P99``-style names (``P99.9``
for a fractional one). The JSON holds the same numbers under
``mean_ttft_ms``, ``median_ttft_ms``, ``std_ttft_ms``, ``p99_ttft_ms``,
..., beside the per-request lists (``input_lens``, ``output_lens``,
``ttfts``, ``itls``, ``start_times``, ``generated_texts``, ``errors``,
kept only with ``--save-detailed``; ``latencies`` and ``queue_times``
always).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from launch.bench_serve.metrics import BenchmarkMetrics, Distribution, distribution
from launch.bench_serve.request import RequestOutput

# Metric name -> (its name in the table, its block's title).
METRIC_TITLES = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
    "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
    "e2el_including_client_queue": ("E2EL incl. Client Queue",
                                    "Queue-inclusive End-to-end Latency"),
}
# Per-request lists that only --save-detailed keeps.
DETAILED_FIELDS = ("input_lens", "output_lens", "start_times", "ttfts", "itls",
                   "generated_texts", "errors")


def _row(label: str, value: Any, decimals: bool = True) -> str:
    return f"{label:<40} {value:<10.2f}" if decimals else f"{label:<40} {value:<10}"


def percentile_name(p: float) -> str:
    """``99`` for 99.0, ``99.9`` for 99.9."""
    return str(int(p)) if int(p) == p else str(p)


def metric_distributions(metrics: BenchmarkMetrics, outputs: Sequence[RequestOutput],
                         percentiles: Sequence[float], max_concurrency: int | None,
                         request_rate: float) -> dict[str, Distribution]:
    """Every metric a table block can show; the queue metrics only where
    vLLM defines them (a concurrency limit; with a finite rate too)."""
    found = {"ttft": metrics.ttft, "tpot": metrics.tpot, "itl": metrics.itl,
             "e2el": metrics.e2el}
    ok = [o for o in outputs if o.success]
    if max_concurrency is not None:
        found["client_queue_time"] = distribution([o.client_queue_time for o in ok],
                                                  percentiles)
        if not math.isinf(request_rate):
            found["e2el_including_client_queue"] = distribution(
                [o.latency + o.client_queue_time for o in ok], percentiles)
    return found


def selected_blocks(found: dict[str, Distribution],
                    selected: Sequence[str]) -> dict[str, Distribution]:
    """The blocks of the ``selected`` metrics that ``found`` holds, in
    vLLM's fixed order (``METRIC_TITLES``), whatever the order given."""
    return {name: found[name] for name in METRIC_TITLES if name in selected and name in found}


def summary_lines(metrics: BenchmarkMetrics, duration_s: float, max_concurrency: int | None,
                  request_rate: float, goodput: bool,
                  blocks: dict[str, Distribution], probe: dict | None = None) -> list[str]:
    """The summary table; ``blocks``: the metrics to show, in order;
    ``probe``: the probe requests' fields (``probe.probe_stats``), shown
    before the blocks, as vLLM's."""
    lines = [f"{' Serving Benchmark Result ':=^50}",
             _row("Successful requests:", metrics.completed, False),
             _row("Failed requests:", metrics.failed, False)]
    if max_concurrency is not None:
        lines.append(_row("Maximum request concurrency:", max_concurrency, False))
    if not math.isinf(request_rate):
        lines.append(_row("Request rate configured (RPS):", request_rate))
    lines += [_row("Benchmark duration (s):", duration_s),
              _row("Total input tokens:", metrics.total_input, False),
              _row("Total generated tokens:", metrics.total_output, False),
              _row("Request throughput (req/s):", metrics.request_throughput)]
    if goodput:
        lines.append(_row("Request goodput (req/s):", metrics.request_goodput))
    lines += [_row("Output token throughput (tok/s):", metrics.output_throughput),
              _row("Peak output token throughput (tok/s):", metrics.max_output_tokens_per_s),
              _row("Peak concurrent requests:", metrics.max_concurrent_requests),
              _row("Total Token throughput (tok/s):", metrics.total_token_throughput)]
    if probe:
        lines += [f"{'Probe Requests':-^50}",
                  _row("Probe requests completed:", probe["probe_completed"], False),
                  _row("Probe requests failed:", probe["probe_failed"], False),
                  _row("Median probe E2EL (ms):", probe["probe_median_e2el_ms"]),
                  _row("P99 probe E2EL (ms):", probe["probe_p99_e2el_ms"]),
                  _row("Max probe E2EL (ms):", probe["probe_max_e2el_ms"])]
    for name, dist in blocks.items():
        short, title = METRIC_TITLES[name]
        lines += [f"{title:-^50}", _row(f"Mean {short} (ms):", dist.mean),
                  _row(f"Median {short} (ms):", dist.median)]
        lines += [_row(f"P{percentile_name(p)} {short} (ms):", value)
                  for p, value in dist.percentiles]
    lines.append("=" * 50)
    return lines


def result_fields(metrics: BenchmarkMetrics, outputs: Sequence[RequestOutput],
                  duration_s: float, goodput: bool,
                  blocks: dict[str, Distribution]) -> dict[str, Any]:
    """The run's part of the result JSON (vLLM's names), per-request lists
    included."""
    result: dict[str, Any] = {
        "duration": duration_s, "completed": metrics.completed, "failed": metrics.failed,
        "total_input_tokens": metrics.total_input, "total_output_tokens": metrics.total_output,
        "request_throughput": metrics.request_throughput,
        "request_goodput": metrics.request_goodput if goodput else None,
        "output_throughput": metrics.output_throughput,
        "total_token_throughput": metrics.total_token_throughput,
        "input_lens": [o.prompt_len for o in outputs], "output_lens": metrics.output_lens,
        "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
        "latencies": [o.latency for o in outputs],
        "start_times": [o.start_time for o in outputs],
        "queue_times": [o.client_queue_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
        "max_output_tokens_per_s": metrics.max_output_tokens_per_s,
        "max_concurrent_requests": metrics.max_concurrent_requests, "rtfx": 0.0,
    }
    for name, dist in blocks.items():
        result.update({f"mean_{name}_ms": dist.mean, f"median_{name}_ms": dist.median,
                       f"std_{name}_ms": dist.std})
        result.update({f"p{percentile_name(p)}_{name}_ms": value
                       for p, value in dist.percentiles})
    return {k: (float(v) if isinstance(v, np.floating) else v) for k, v in result.items()}
