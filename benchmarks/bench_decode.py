"""Decode step time against the bandwidth floor, and device idle between steps.

    python benchmarks/bench_decode.py --shape 8b --batches 1 8 32 128 256 --contexts 512 4096
    torchrun --nproc-per-node 2 benchmarks/bench_decode.py --shape 8b ...   (TP=2, NCCL)

Drives the ModelRunner directly (no engine, no IPC) on real shapes with
random bf16 weights (``load_format="dummy"``). Requests enter with their
context already counted as computed (the KV values are whatever the cache
holds: the timing does not depend on them), then decode ``--steps`` steps.

Floor of a step = (weight bytes + KV bytes read) / copy bandwidth, the copy
bandwidth measured in the same run (bytes read + written by a large
device-to-device copy). ``--idle`` also measures how long the GPU sits idle
when the host waits for each step's output before sending the next ("sync")
and when it keeps one step in flight ("async", what async scheduling does),
two ways: ``between_steps_*`` from CUDA events at each step's start and end
(the device waiting for the host between steps), ``idle_*`` from the torch
profiler (every gap, including the launch gaps between kernels inside a
step). Prints a JSON summary last.

Under torchrun (WORLD_SIZE > 1) every rank drives its own shard with the same
plans, as the worker daemons do, and the model's NCCL all-reduces keep them in
step; the floor is then this rank's shard (weights + KV) over its bandwidth.
Rank 0 prints.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.shapes import write_shape  # noqa: E402
from benchmarks.summary import emit_summary  # noqa: E402
from executor.multiproc import NO_MULTICAST  # noqa: E402
from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput  # noqa: E402
from runner.config import RunnerConfig  # noqa: E402
from runner.distributed import TensorParallelGroup  # noqa: E402
from runner.layers import triton_skinny_matmul  # noqa: E402
from runner.model_runner import ModelRunner  # noqa: E402


def copy_bandwidth(device: torch.device, nbytes: int = 4 << 30) -> float:
    """Bytes per second moved (read + write) by a device-to-device copy."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / 10
    del src, dst
    return 2 * nbytes / seconds


class DecodeDriver:
    """Feeds hand-made SchedulerOutputs to a runner: N requests decoding."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.step_id = 0
        self.computed: dict[str, int] = {}
        self.next_block = 0

    def _plan(self, **kwargs) -> SchedulerOutput:
        self.step_id += 1
        return SchedulerOutput(step_id=self.step_id, **kwargs)

    def start(self, batch: int, context: int, max_steps: int) -> None:
        """Add ``batch`` requests whose ``context`` tokens count as computed;
        the first step feeds their last context token."""
        block = self.runner.config.block_size
        blocks_per_req = -(-(context + max_steps + 1) // block)
        new = []
        for i in range(batch):
            blocks = list(range(i * blocks_per_req, (i + 1) * blocks_per_req))
            new.append(NewRequestData(
                req_id=f"r{i}", prompt_token_ids=[1] * context, prefill_token_ids=[1] * context,
                sampling=SamplingOptions(temperature=0.0), block_ids=[blocks],
                num_computed_tokens=context - 1, max_tokens=max_steps + 1))
            self.computed[f"r{i}"] = context - 1
        self.pending_new = new

    def step_plan(self) -> SchedulerOutput:
        ids = list(self.computed)
        if self.pending_new:
            new, self.pending_new = self.pending_new, []
            plan = self._plan(scheduled_new_reqs=new, num_scheduled_tokens=dict.fromkeys(ids, 1),
                              total_num_scheduled_tokens=len(ids))
        else:
            cached = CachedRequestData(req_ids=ids, new_block_ids=[[[]] for _ in ids],
                                       num_computed_tokens=[self.computed[r] for r in ids])
            plan = self._plan(scheduled_cached_reqs=cached,
                              num_scheduled_tokens=dict.fromkeys(ids, 1),
                              total_num_scheduled_tokens=len(ids))
        for r in ids:
            self.computed[r] += 1
        return plan

    def finish(self) -> None:
        plan = self._plan(finished_req_ids=list(self.computed))
        self.computed = {}
        self.runner.execute_model(plan)
        self.runner.sample_tokens().get_output()

    def run(self, steps: int, overlap: bool, marks: list | None = None) -> float:
        """Run ``steps`` decode steps; returns wall seconds per step.

        overlap=False: wait for each step's output before the next (no async
        scheduling). overlap=True: keep one step in flight. ``marks`` gets a
        (start, end) pair of CUDA events per step, recorded around its device
        work (input copy ... sampling).
        """
        in_flight = None
        start = time.perf_counter()
        for _ in range(steps):
            if marks is not None:
                marks.append((torch.cuda.Event(enable_timing=True),
                              torch.cuda.Event(enable_timing=True)))
                marks[-1][0].record()
            self.runner.execute_model(self.step_plan())
            output = self.runner.sample_tokens()
            if marks is not None:
                marks[-1][1].record()
            if not overlap:
                output.get_output()
            elif in_flight is not None:
                in_flight.get_output()
            in_flight = output
        if in_flight is not None:
            in_flight.get_output()
        return (time.perf_counter() - start) / steps


def idle_between_steps(driver: DecodeDriver, steps: int, overlap: bool) -> dict:
    """Device idle between consecutive steps, from CUDA events on the main
    stream: one recorded before a step's first device work (its input copy),
    one after its last (sampling). The stream passes step N+1's start marker
    right after step N's end marker when the host queued it in time; the gap
    between them is the time the device waited for the host."""
    marks: list = []
    driver.run(steps, overlap, marks)
    torch.cuda.synchronize()
    gaps = [marks[i][1].elapsed_time(marks[i + 1][0]) for i in range(steps - 1)]
    span = marks[0][0].elapsed_time(marks[-1][0])
    return {"idle_fraction": round(sum(gaps) / span, 4),
            "gap_us_median": round(statistics.median(gaps) * 1e3, 1)}


def gpu_idle_fraction(driver: DecodeDriver, steps: int, overlap: bool) -> dict:
    """Share of the profiled span during which no kernel or copy runs: the
    gaps between steps plus the launch gaps between the kernels inside each
    step (a graph replay still leaves about a microsecond between kernels)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        driver.run(steps, overlap)
    intervals = sorted(
        (e.time_range.start, e.time_range.end) for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    if not intervals:
        return {"idle_fraction": None}
    busy, (cur_start, cur_end) = 0, intervals[0]
    for s, e in intervals[1:]:
        if s > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    busy += cur_end - cur_start
    span = intervals[-1][1] - intervals[0][0]
    return {"idle_fraction": round(1 - busy / span, 4), "span_us": span}


def profile_host(runner: ModelRunner, context: int) -> None:
    """cProfile of 50 batch-1 decode steps with one step in flight."""
    import cProfile
    import pstats

    driver = DecodeDriver(runner)
    driver.start(1, context, 80)
    driver.run(5, overlap=True)
    profiler = cProfile.Profile()
    profiler.enable()
    driver.run(50, overlap=True)
    profiler.disable()
    driver.finish()
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(30)


def kernel_table(runner: ModelRunner, batch: int, context: int, show: bool = True) -> None:
    """Device time by kernel over 10 decode steps (torch profiler), to stderr."""
    from torch.profiler import ProfilerActivity, profile

    driver = DecodeDriver(runner)
    driver.start(batch, context, 40)
    driver.run(5, overlap=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        driver.run(10, overlap=True)
    driver.finish()
    if show:
        print(f"kernels, batch {batch}, context {context}, 10 steps:", file=sys.stderr)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25),
              file=sys.stderr)


def init_device() -> torch.device:
    """This rank's GPU; under torchrun also the NCCL process group (NVLink
    multicast off, as tprun's workers have it)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        for name, value in NO_MULTICAST.items():
            os.environ.setdefault(name, value)
        dist.init_process_group("nccl", device_id=device)
    return device


def agreed_num_blocks(num_blocks: int, device: torch.device) -> int:
    """The minimum over the ranks, as the executor takes it."""
    if not dist.is_initialized():
        return num_blocks
    value = torch.tensor([num_blocks], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8b", choices=("1b", "8b"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--idle", action="store_true", help="also measure GPU idle time")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--profile-host", action="store_true",
                        help="also print a cProfile of the host side of 50 batch-1 steps")
    parser.add_argument("--kernel-table", action="store_true",
                        help="also print device time by kernel for batches 1 and the largest")
    parser.add_argument("--cublas-only", action="store_true",
                        help="row-parallel projections through cuBLAS at every batch size "
                             "(no skinny Triton matmul), to compare")
    parser.add_argument("--disable-custom-all-reduce", action="store_true",
                        help="NCCL for every all-reduce (TP > 1), to compare")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.cublas_only:
        triton_skinny_matmul.SKINNY_MAX_ROWS = 0

    device = init_device()
    rank = dist.get_rank() if dist.is_initialized() else 0
    bandwidth = copy_bandwidth(device)
    model_dir = write_shape(args.shape, tempfile.mkdtemp(prefix="tprun-shape-"))
    max_len = max(args.contexts) + args.steps + 64
    config = RunnerConfig(model=model_dir, device="cuda", dtype="bfloat16", block_size=16,
                          max_num_seqs=max(args.batches), max_model_len=max_len,
                          max_num_batched_tokens=max(2048, max(args.batches)),
                          load_format="dummy", enforce_eager=args.enforce_eager,
                          disable_custom_all_reduce=args.disable_custom_all_reduce)
    runner = ModelRunner(config, device, TensorParallelGroup.from_default_group())
    num_blocks = agreed_num_blocks(runner.determine_num_blocks(), device)
    start = time.perf_counter()
    runner.init_kv_cache(num_blocks)
    init_s = time.perf_counter() - start
    weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    kv_per_token = runner.bytes_per_block() // config.block_size

    results = []
    for context in args.contexts:
        for batch in args.batches:
            blocks_needed = batch * -(-(context + 2 * args.steps + 36) // config.block_size)
            row = {"shape": args.shape, "batch": batch, "context": context}
            if blocks_needed > num_blocks:
                row["skipped"] = f"KV of {blocks_needed} blocks does not fit {num_blocks}"
                results.append(row)
                continue
            driver = DecodeDriver(runner)
            driver.start(batch, context, 2 * args.steps + 28)
            driver.run(5, overlap=True)  # warm-up
            times = [driver.run(args.steps, overlap=True) for _ in range(1)]
            step_s = statistics.median(times)
            floor_s = (weight_bytes + batch * context * kv_per_token) / bandwidth
            row.update(step_ms=round(step_s * 1e3, 4), floor_ms=round(floor_s * 1e3, 4),
                       ratio_to_floor=round(step_s / floor_s, 3),
                       tokens_per_s=round(batch / step_s, 1))
            if args.idle:
                row["idle_sync"] = gpu_idle_fraction(driver, 10, overlap=False)
                row["idle_async"] = gpu_idle_fraction(driver, 10, overlap=True)
                row["between_steps_sync"] = idle_between_steps(driver, 10, overlap=False)
                row["between_steps_async"] = idle_between_steps(driver, 10, overlap=True)
            driver.finish()
            results.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)

    if args.profile_host and not dist.is_initialized():  # one rank alone: peers would wait
        profile_host(runner, min(args.contexts))
    if args.kernel_table:
        for batch in sorted({1, min(64, max(args.batches))}):
            kernel_table(runner, batch, min(args.contexts), show=rank == 0)
    summary = {
        "benchmark": "decode_step", "shape": args.shape, "device": torch.cuda.get_device_name(),
        "tp": dist.get_world_size() if dist.is_initialized() else 1,
        "copy_bandwidth_GBps": round(bandwidth / 1e9, 1), "weight_GB": round(weight_bytes / 1e9, 3),
        "num_blocks": num_blocks, "cuda_graphs": not args.enforce_eager,
        "graph_sizes": runner.graphs.sizes, "init_kv_and_graphs_s": round(init_s, 2),
        "skinny_max_rows": triton_skinny_matmul.SKINNY_MAX_ROWS,
        "custom_all_reduce": runner.tp.peer is not None,
        "date": time.strftime("%Y-%m-%d"), "results": results,
    }
    if rank == 0:
        emit_summary(summary, args.out)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
