"""Host time of the runner's step, with the model's work taken out.

    python -m benchmarks.bench_runner_host [--device cpu|cuda] [--iters 200]
        [--temperature 0.0] [--profile N] [--out FILE]

What the worker spends between receiving a plan and having queued its
sampling, on the embedded tiny model (its size does not matter: the
forward pass is stubbed out). Two steps:

- ``prefill_512``: one new request of 512 prompt tokens (it finishes in an
  untimed step between iterations), as the first step of a request at low
  load;
- ``decode_64``: a decode step of 64 requests.

The model's forward pass is replaced by its embedding lookup (the shapes
stay, the layers go). On CUDA both steps replay CUDA graphs, as the
server's do (the prefill from the mixed-batch graph of 512 tokens,
captured around that stub), so the replay costs its launch only. On CPU the
graph replays are emulated and return the outputs of one real run per
graph size, so no device work (there: host work) is timed either; the
torch reference kernels the host path still calls (staged-write applies,
the sampler's argmax) are timed apart (``cpu_kernels_us``) and taken out
of the other figures (on CUDA they are launches, and stay in). CPU runs
use ``--threads`` intra-op threads (1: no thread pool to wake). The sampler
runs on the stub's logits (greedy unless ``--temperature``).

Reports, per step, the median microseconds over ``--iters`` of
``execute_model``, ``sample_tokens`` (to its AsyncOutput) and their sum
(``host_us``), and of ``get_output`` after the device has finished (the
reply's host work). ``--profile N`` prints cProfile's table of the N
costliest functions of each step (sorted by the environment's
``BENCH_SORT``, a pstats key; cumulative time by default) before the summary.
Prints a JSON summary last.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import os
import pstats
import statistics
import tempfile
import time

import numpy as np
import torch

from benchmarks.common import emit_summary, synchronize
from checkpoint.description import describe
from checkpoint.tiny_model import EOS, ensure_tiny_model
from engine.config import EngineConfig
from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
from runner.cuda_graphs import CudaGraphManager
from runner.distributed import TensorParallelGroup
from runner.model_runner import ModelRunner

BLOCK_SIZE = 16
PROMPT_LEN = 512
DECODE_BATCH = 64
DECODE_PROMPT = 16


def _stub_forward(runner: ModelRunner) -> None:
    """The model's forward pass becomes its embedding lookup: hidden states
    of the right shape and dtype, one kernel."""
    embed = runner.model.embed_tokens

    def forward(input_ids, positions, kv_caches, attn):
        return embed(input_ids)

    runner.model.forward = forward


def _cached_replays(manager: CudaGraphManager) -> None:
    """An emulated manager whose replay returns the outputs of its first
    run at each size: the step's device work, done once."""
    run, cache = manager.forward, {}

    def forward(size):
        if size not in cache:
            cache[size] = run(size)
        return cache[size]

    manager.forward = forward


class KernelClock:
    """Seconds spent inside the device's kernels that the host path calls
    (staged-write applies, the sampler's argmax and Gumbel draw). On CPU they
    are the device's work, done on the host, and are taken out of the host
    figures; on CUDA they are launches, host work, and stay in."""

    def __init__(self):
        self.seconds = 0.0

    def wrap(self, fn):
        def timed(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed

    def install(self, runner: ModelRunner) -> None:
        runner.staged_writes._apply = self.wrap(runner.staged_writes._apply)
        ops = runner.sampler.ops
        runner.sampler.ops = dataclasses.replace(
            ops, greedy_argmax=self.wrap(ops.greedy_argmax),
            gumbel_argmax=self.wrap(ops.gumbel_argmax))


def build_runner(device: torch.device, model_dir: str) -> ModelRunner:
    from runner.cuda_graphs import capture_sizes, prefill_capture_sizes

    max_len = 2048
    num_blocks = DECODE_BATCH * (-(-max_len // BLOCK_SIZE)) + 64
    config = EngineConfig(model=model_dir, device=device.type, max_num_seqs=128,
                          max_num_batched_tokens=2048, max_model_len=max_len,
                          block_size=BLOCK_SIZE).runner_config(model_dir, describe(model_dir))
    runner = ModelRunner(config, device, TensorParallelGroup.from_default_group())
    _stub_forward(runner)
    if device.type != "cuda":
        runner.graphs = CudaGraphManager(capture_sizes(128, 2048), emulate=True)
        runner.prefill_graphs = CudaGraphManager(prefill_capture_sizes(2048, 2048),
                                                 emulate=True)
    runner.init_kv_cache(num_blocks)
    if device.type != "cuda":
        _cached_replays(runner.graphs)
        _cached_replays(runner.prefill_graphs)
    return runner


def _sampling(temperature: float) -> SamplingOptions:
    if temperature == 0.0:
        return SamplingOptions(temperature=0.0)
    return SamplingOptions(temperature=temperature, top_p=0.95, top_k=50)


def _new(req_id: str, prompt: list[int], blocks: list[int], sampling: SamplingOptions,
         max_tokens: int) -> NewRequestData:
    return NewRequestData(req_id=req_id, prompt_token_ids=prompt, prefill_token_ids=prompt,
                          sampling=sampling, block_ids=[blocks], num_computed_tokens=0,
                          max_tokens=max_tokens, min_tokens_stop_ids=[EOS])


class StepTimer:
    """Times execute_model, sample_tokens and get_output of each plan."""

    def __init__(self, runner: ModelRunner, clock: KernelClock | None):
        self.runner = runner
        self.clock = clock
        self.samples: dict[str, list[float]] = {"execute_model": [], "sample_tokens": [],
                                                "host": [], "get_output": []}
        if clock is not None:
            self.samples["cpu_kernels"] = []

    def step(self, plan: SchedulerOutput, record: bool = True):
        r, clock = self.runner, self.clock
        k0 = clock.seconds if clock else 0.0
        t0 = time.perf_counter()
        r.execute_model(plan)
        k1 = clock.seconds if clock else 0.0
        t1 = time.perf_counter()
        out = r.sample_tokens()
        t2 = time.perf_counter()
        k2 = clock.seconds if clock else 0.0
        synchronize(r.device)
        t3 = time.perf_counter()
        reply = out.get_output()
        t4 = time.perf_counter()
        if record:
            execute, sample = (t1 - t0) - (k1 - k0), (t2 - t1) - (k2 - k1)
            for key, value in (("execute_model", execute), ("sample_tokens", sample),
                               ("host", execute + sample), ("get_output", t4 - t3)):
                self.samples[key].append(value)
            if clock is not None:
                self.samples["cpu_kernels"].append(k2 - k0)
        return reply

    def summary(self) -> dict:
        return {f"{k}_us": round(statistics.median(v) * 1e6, 1) for k, v in self.samples.items()}


def prefill_plans(runner: ModelRunner, iters: int, sampling: SamplingOptions):
    """(timed plan, untimed finishing plan) pairs: one 512-token request each."""
    rng = np.random.default_rng(0)
    vocab = runner.model.config.vocab_size
    blocks = list(range(-(-(PROMPT_LEN + 1) // BLOCK_SIZE)))
    for i in range(iters):
        prompt = rng.integers(0, vocab, PROMPT_LEN).tolist()
        req_id = f"p{i}"
        yield (SchedulerOutput(step_id=2 * i, scheduled_new_reqs=[
                   _new(req_id, prompt, blocks, sampling, 1)],
                   num_scheduled_tokens=[PROMPT_LEN]),
               SchedulerOutput(step_id=2 * i + 1, finished_req_ids=[req_id]))


def time_prefill(runner: ModelRunner, clock: KernelClock | None, iters: int, warmup: int,
                 sampling: SamplingOptions, profile: int) -> dict:
    timer = StepTimer(runner, clock)
    plans = list(prefill_plans(runner, iters + warmup, sampling))
    prof = cProfile.Profile()
    for i, (plan, finish) in enumerate(plans):
        timed = i >= warmup
        if timed and profile:
            prof.enable()
        timer.step(plan, record=timed)
        if timed and profile:
            prof.disable()
        timer.step(finish, record=False)
    _print_profile("prefill_512", prof, profile)
    return {"num_tokens": PROMPT_LEN, **timer.summary()}


def time_decode(runner: ModelRunner, clock: KernelClock | None, iters: int, warmup: int,
                sampling: SamplingOptions, profile: int) -> dict:
    timer = StepTimer(runner, clock)
    rng = np.random.default_rng(1)
    vocab = runner.model.config.vocab_size
    ids = [f"d{i}" for i in range(DECODE_BATCH)]
    per_req = -(-(DECODE_PROMPT + iters + warmup + 2) // BLOCK_SIZE)
    new = [_new(r, rng.integers(0, vocab, DECODE_PROMPT).tolist(),
                list(range(i * per_req, (i + 1) * per_req)), sampling, iters + warmup + 1)
           for i, r in enumerate(ids)]
    timer.step(SchedulerOutput(step_id=0, scheduled_new_reqs=new,
                               num_scheduled_tokens=[DECODE_PROMPT] * DECODE_BATCH),
               record=False)
    prof = cProfile.Profile()
    for step in range(1, iters + warmup + 1):
        plan = SchedulerOutput(
            step_id=step,
            scheduled_cached_reqs=CachedRequestData(req_ids=ids, new_block_ids=[None] * len(ids)),
            num_scheduled_tokens=[1] * len(ids))
        timed = step > warmup
        if timed and profile:
            prof.enable()
        timer.step(plan, record=timed)
        if timed and profile:
            prof.disable()
    _print_profile(f"decode_{DECODE_BATCH}", prof, profile)
    timer.step(SchedulerOutput(step_id=iters + warmup + 1, finished_req_ids=ids), record=False)
    return {"num_reqs": DECODE_BATCH, **timer.summary()}


def _print_profile(name: str, prof: cProfile.Profile, top: int) -> None:
    if not top:
        return
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats(os.environ.get("BENCH_SORT", "cumulative")).print_stats(top)
    print(f"==== {name}\n{text.getvalue()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        choices=("cpu", "cuda"))
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy; else with top_p 0.95 and top_k 50")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print cProfile's N costliest functions of each step")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's intra-op threads on CPU (1: no thread pool's wake-ups)")
    parser.add_argument("--out", default=None, help="also write the summary here")
    args = parser.parse_args()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model_dir = ensure_tiny_model(os.environ.get("TPRUN_CACHE") or tempfile.mkdtemp())
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    runner = build_runner(device, model_dir)
    clock = None
    if device.type == "cpu":
        clock = KernelClock()
        clock.install(runner)
    sampling = _sampling(args.temperature)
    summary = {
        "benchmark": "runner_host",
        "device": args.device,
        "torch": torch.__version__,
        "temperature": args.temperature,
        "iters": args.iters,
        "threads": args.threads if device.type == "cpu" else None,
        "prefill_512": time_prefill(runner, clock, args.iters, args.warmup, sampling,
                                    args.profile),
        f"decode_{DECODE_BATCH}": time_decode(runner, clock, args.iters, args.warmup, sampling,
                                              args.profile),
    }
    emit_summary(summary, args.out)


if __name__ == "__main__":
    main()
