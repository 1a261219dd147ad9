"""What every benchmark shares: device set-up, timing, engine timing, the summary.

Benchmarks run as modules from the repository root (``python -m
benchmarks.bench_decode ...``, ``torchrun ... -m benchmarks.bench_decode``),
so they import the project as any client does.

Engine timing (TTFT, ITL, throughput) is ``tprun bench``'s own
(engine/bench.py): one definition of inter-token latency for the CLI and
the benchmarks alike. torch is imported where it is used, so a benchmark
without it (bench_ipc and its worker processes) starts without loading it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


# ---- device set-up -----------------------------------------------------------
def init_device(kind: str) -> torch.device:
    """This rank's device; under torchrun (WORLD_SIZE > 1) also the process
    group: NCCL with NVLink multicast off, as tprun's workers have it; gloo
    on CPU."""
    import torch
    import torch.distributed as dist

    from worker.env import disable_multicast

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if kind == "cpu":
        if distributed:
            dist.init_process_group("gloo")
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if distributed:
        disable_multicast()
        dist.init_process_group("nccl", device_id=device)
    return device


def device_name(device: torch.device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


# ---- timing ------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_per_call(fn: Callable[[], object], device: torch.device, iters: int = 10,
                  warmup: int = 3) -> float:
    """Seconds per call of ``fn``: the mean over ``iters`` back-to-back calls
    after ``warmup`` (CUDA events on GPU, the wall clock elsewhere)."""
    import torch

    for _ in range(warmup):
        fn()
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1000 / iters
    start_s = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start_s) / iters


def timed_generation(engine, prompts: list[list[int]], output_len: int,
                     warmup_count: int) -> dict:
    """Warm up with ``warmup_count`` of the prompts (4 tokens each, so every
    kernel variant the timed run needs is compiled first), then submit all
    prompts at once and step the engine until each has generated
    ``output_len`` tokens (greedy, eos ignored). TTFT and ITL are
    ``tprun bench``'s (engine/bench.py: TTFT from each request's submit,
    a delta's gap shared by its tokens); times in ms."""
    from engine.bench import BenchRequest, latencies, percentiles, run_requests

    warm = [BenchRequest({"prompt_token_ids": p}, 4) for p in prompts[:warmup_count]]
    run_requests(engine, warm, progress=False, id_prefix="warmup-")
    requests = [BenchRequest({"prompt_token_ids": p}, output_len) for p in prompts]
    timings, elapsed, _ = run_requests(engine, requests, progress=False)
    ttft, itl = (percentiles(values) for values in latencies(timings))
    total = sum(n for t in timings.values() for _, n in t.arrivals)
    return {"output_tokens": total, "elapsed_s": round(elapsed, 3),
            "output_tokens_per_s": round(total / elapsed, 1),
            "ttft_ms_p50": round(ttft["p50"], 3), "ttft_ms_p99": round(ttft["p99"], 3),
            "itl_ms_mean": round(itl["mean"], 3), "itl_ms_p50": round(itl["p50"], 3),
            "itl_ms_p99": round(itl["p99"], 3)}


# ---- the summary -------------------------------------------------------------
def emit_summary(summary: dict, out: str | None) -> None:
    """How every benchmark ends: one JSON object on one line, printed last
    (so a reader takes the last line of the output), also written to ``out``."""
    text = json.dumps(summary)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)
