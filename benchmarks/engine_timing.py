"""Timing generation through the in-process engine: throughput, TTFT, ITL."""

from __future__ import annotations

import statistics
import time


def timed_generation(engine, prompts: list[list[int]], output_len: int,
                     warmup_count: int) -> dict:
    """Warm up with ``warmup_count`` of the prompts (so every kernel variant
    the timed run needs is compiled first), then add all prompts at once and
    step the engine until they finish, each generating ``output_len`` tokens
    (greedy, eos ignored). Times in ms; TTFT counts from the common start."""
    from engine import SamplingParams

    for p in prompts[:warmup_count]:
        engine.add_request({"prompt_token_ids": p}, SamplingParams(temperature=0.0, max_tokens=4))
    while engine.has_unfinished_requests():
        engine.step()
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    times: dict[str, list[float]] = {}
    start = time.perf_counter()
    for p in prompts:
        times[engine.add_request({"prompt_token_ids": p}, params).req_id] = []
    while engine.has_unfinished_requests():
        for delta in engine.step():
            times[delta.req_id].extend([time.perf_counter()] * len(delta.new_token_ids))
    elapsed = time.perf_counter() - start
    ttft = [t[0] - start for t in times.values() if t]
    itl = [b - a for t in times.values() for a, b in zip(t, t[1:]) if b > a]
    total = sum(len(t) for t in times.values())
    pct = lambda xs, q: round(statistics.quantiles(xs, n=100)[q - 1] * 1e3, 3)  # noqa: E731
    return {"output_tokens": total, "elapsed_s": round(elapsed, 3),
            "output_tokens_per_s": round(total / elapsed, 1),
            "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
            "itl_ms_mean": round(statistics.mean(itl) * 1e3, 3), "itl_ms_p50": pct(itl, 50),
            "itl_ms_p99": pct(itl, 99)}
