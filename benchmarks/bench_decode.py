"""Decode step time against the bandwidth floor (and a torch.compile peer), and device idle.

    python -m benchmarks.bench_decode --shape 8b --batches 1 8 32 128 256 --contexts 512 4096
    python -m benchmarks.bench_decode --shape 8b --batches 1 8 32 64 --contexts 512 4096 --peer
    torchrun --nproc-per-node 2 -m benchmarks.bench_decode --shape 8b ...   (TP=2, NCCL)
    python -m benchmarks.bench_decode --shape tiny --device cpu --dtype float32 --peer ...
    python -m benchmarks.bench_decode --shape 8b --batches 1 8 32 64 --contexts 512 \
        --spec-tokens 1 2 3 4 --spec-proposer replay --replay-accept 0.7
    python -m benchmarks.bench_decode --shape 8b --batches 1 8 32 --contexts 512 \
        --max-loras 4 --max-lora-rank 16 --variants default lora-masked lora-triton-all
    python -m benchmarks.bench_decode --shape 1b --batches 1 64 --contexts 512 --temperature 1

Drives the ModelRunner directly (no engine, no IPC) on real shapes with
random weights (``load_format="dummy"``). Requests enter with their
context already counted as computed (the KV values are whatever the cache
holds: the timing does not depend on them), then decode: a few untimed
steps, then ``--rounds`` timed rounds of ``--steps`` steps; the row's step
time is the rounds' median (all of them in ``step_ms_rounds``), so a round
that the device's clocks or a neighbour slowed does not decide it.

Floor of a step (benchmarks/floor.py): the bytes a step must read (every
weight once but the embedding table, of which one row per token, plus the
KV of the batch) over the best streaming bandwidth of a read-only kernel or
a copy, all measured in the same run; the JSON names the kernel used.

``--peer`` also times, in the same process and for every (batch, context)
row, the torch.compile'd decoder of benchmarks/peer_decoder.py (same shape,
random weights, static KV cache of the row's batch, CUDA graphs): each row
then holds both step times and their ratio (tprun / peer).

``--idle`` also measures how long the GPU sits idle
when the host waits for each step's output before sending the next ("sync")
and when it keeps one step in flight ("async", what async scheduling does),
two ways: ``between_steps_*`` from CUDA events at each step's start and end
(the device waiting for the host between steps), ``idle_*`` from the torch
profiler (every gap, including the launch gaps between kernels inside a
step). ``--timeline`` gives each row the step's critical path by kernel
(``benchmarks/step_timeline.py``: each kernel's share of a layer, and what
lies between two forwards). ``--variants NAME ...`` times every row
under each named variant of the kernel choices
(``benchmarks/decode_variants.py``) in one process: per round the
variants in turn, the decode graphs captured anew under each, so small
differences are not lost in the spread between processes; each row then
holds every variant's step time, its ratio to the first and its own check
against eager steps. Prints a JSON summary last.

The rows' requests decode greedily; with ``--temperature T`` each samples
at T instead (and ``--top-p`` / ``--top-k`` / ``--min-p`` filter,
``--repetition-penalty`` penalises, ``--logprobs`` asks for top logprobs,
as vLLM's parameters of those names),
with a seed of its own (the sampler's draw after the
graph's replay), so the timed steps and their check draw the same tokens.

Every row is checked: CHECK_STEPS steps as timed (graph replays
where captured) against the same steps run eagerly (the graphs set aside),
each from the same random KV cache, must give the same tokens
(``eager_check``); a row that does not is named in the summary's
``problems`` and the exit code is 1. Each row also says whether its
forward carried the decoder norms in the matmuls (``norms_in_matmuls``,
``CausalLM.carries_norms``).

``--spec-tokens K ...`` also times, after the plain rows, a speculative
runner per k (same weights) decoding 1 + k query tokens a request
(benchmarks/spec_rows.py): each row gets ``spec[k]`` with the step time,
its ratio to the plain step of the row (the verify cost), the tokens a
step emits at the acceptance measured and the time per output token.
``--spec-proposer replay`` (default) drafts a plain run's tokens with
``--replay-accept`` of them kept, for a known acceptance; ``ngram`` drafts
by prompt lookup (random weights: whatever acceptance the model makes).

``--max-loras N --max-lora-rank R`` runs every row with LoRA on: a random
adapter of rank R in each of the N slots, request i running slot i % N
(``benchmarks/lora_rows.py``); the floor adds the adapters' bytes a step
reads, and every row is still checked against eager steps. After those
rows, a runner without LoRA (same shape) times the same rows in the same
process: each row gets ``plain`` with that step time and
``lora_over_plain``, the LoRA step's cost over the plain one. With
``--variants`` the variants run on the LoRA rows (``lora-masked``: the
torch masked form over every slot at every size; ``lora-triton-all``:
runner/lora/triton_lora.py's kernels at every size).

Under torchrun (WORLD_SIZE > 1) every rank drives its own shard with the same
plans, as the worker daemons do, and the model's NCCL all-reduces keep them in
step; the floor is then this rank's shard (weights + KV) over its bandwidth.
Rank 0 prints.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time

import msgspec
import torch
import torch.distributed as dist

from benchmarks import decode_variants, floor, lora_rows, step_timeline
from benchmarks.common import device_name, emit_summary, init_device, synchronize
from benchmarks.peer_decoder import PeerConfig, PeerDecoder, compile_step
from benchmarks.shapes import SHAPES, shape_config, write_shape
from benchmarks.spec_rows import (
    SpecDecodeDriver,
    install_replay,
    row_tokens,
    spec_runner,
    zero_kv,
)
from checkpoint.description import describe
from engine.config import MAX_LORA_RANKS, EngineConfig
from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
from runner import ops as runner_ops
from runner.distributed import TensorParallelGroup
from runner.model_runner import ModelRunner

GREEDY = SamplingOptions(temperature=0.0)


class DecodeDriver:
    """Feeds hand-made SchedulerOutputs to a runner: N requests decoding,
    each with ``sampling`` (greedy by default) and, where it samples, a seed
    of its own (its index), so the same row run again draws the same tokens."""

    def __init__(self, runner: ModelRunner, sampling: SamplingOptions = GREEDY):
        self.runner = runner
        self.sampling = sampling
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
        lora = self.runner.lora
        new = []
        for i in range(batch):
            blocks = list(range(i * blocks_per_req, (i + 1) * blocks_per_req))
            new.append(NewRequestData(
                req_id=f"r{i}", prompt_token_ids=[1] * context, prefill_token_ids=[1] * context,
                sampling=(msgspec.structs.replace(self.sampling, seed=i)
                          if self.sampling.temperature else self.sampling),
                block_ids=[blocks],
                num_computed_tokens=context - 1, max_tokens=max_steps + 1,
                lora_slot=i % lora.config.max_loras if lora is not None else -1))
            self.computed[f"r{i}"] = context - 1
        self.pending_new = new

    def step_plan(self) -> SchedulerOutput:
        ids = list(self.computed)
        if self.pending_new:
            new, self.pending_new = self.pending_new, []
            plan = self._plan(scheduled_new_reqs=new, num_scheduled_tokens=[1] * len(ids))
        else:
            cached = CachedRequestData(req_ids=ids, new_block_ids=[None for _ in ids])
            plan = self._plan(scheduled_cached_reqs=cached, num_scheduled_tokens=[1] * len(ids))
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
    records = step_timeline.kernel_records(driver, steps, overlap)
    if not records:
        return {"idle_fraction": None}
    busy = sum(own for _, own in step_timeline.critical_shares(records, records[0][0]))
    span = records[-1][1] - records[0][0]
    return {"idle_fraction": round(1 - busy / span, 4), "span_us": span}


def profile_host(runner: ModelRunner, context: int, sampling: SamplingOptions) -> None:
    """cProfile of 50 batch-1 decode steps with one step in flight."""
    import cProfile
    import pstats

    driver = DecodeDriver(runner, sampling)
    driver.start(1, context, 80)
    driver.run(5, overlap=True)
    profiler = cProfile.Profile()
    profiler.enable()
    driver.run(50, overlap=True)
    profiler.disable()
    driver.finish()
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(30)


def kernel_table(runner: ModelRunner, batch: int, context: int, sampling: SamplingOptions,
                 show: bool = True) -> None:
    """Device time by kernel over 10 decode steps (torch profiler), to stderr."""
    from torch.profiler import ProfilerActivity, profile

    driver = DecodeDriver(runner, sampling)
    driver.start(batch, context, 40)
    driver.run(5, overlap=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        driver.run(10, overlap=True)
    driver.finish()
    if show:
        print(f"kernels, batch {batch}, context {context}, 10 steps:", file=sys.stderr)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25),
              file=sys.stderr)


def agreed_num_blocks(num_blocks: int, device: torch.device) -> int:
    """The minimum over the ranks, as the executor takes it."""
    if not dist.is_initialized():
        return num_blocks
    value = torch.tensor([num_blocks], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


PEER_WARMUP = 5


def time_peer(peer: PeerDecoder, batch: int, context: int, steps: int,
              device: torch.device) -> tuple[float, int]:
    """Seconds per greedy decode step of the compiled peer at ``batch`` rows
    whose ``context`` tokens are cached, a step in flight as tprun has it (no
    wait between steps), and the number of graphs inductor ran without CUDA
    graphs (0 when the whole step replays a graph). Each row compiles and
    captures afresh: the static cache is sized to the row (``context`` + the
    steps, rounded up to 64 for aligned attention masks), as a static-cache
    decoder sizes it to its longest request."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    peer.set_cache(batch, -(-(context + PEER_WARMUP + steps + 1) // 64) * 64)
    step = compile_step("reduce-overhead")
    tokens = torch.ones(batch, 1, dtype=torch.long, device=device)
    pos = torch.tensor([context - 1], device=device)

    def run(n: int) -> None:
        nonlocal tokens
        for _ in range(n):
            torch.compiler.cudagraph_mark_step_begin()
            tokens = step(peer, tokens, pos).clone()
            pos.add_(1)

    with torch.no_grad():
        run(PEER_WARMUP)  # compile, warm up, capture
        synchronize(device)
        start = time.perf_counter()
        run(steps)
        synchronize(device)
    return (time.perf_counter() - start) / steps, counters["inductor"]["cudagraph_skips"]


def peer_fields(peer: PeerDecoder, batch: int, context: int, steps: int, device: torch.device,
                step_s: float, floor_ms: float) -> dict:
    """The peer's step time for one row, its ratio to the floor and tprun's to it."""
    try:
        peer_s, skips = time_peer(peer, batch, context, steps, device)
    except torch.OutOfMemoryError:
        peer.set_cache(1, 16)
        torch.cuda.empty_cache()
        return {"peer_skipped": "out of memory"}
    return {"peer_step_ms": round(peer_s * 1e3, 4),
            "peer_ratio_to_floor": round(peer_s * 1e3 / floor_ms, 3),
            "tprun_to_peer": round(step_s / peer_s, 3), "peer_cudagraph_skips": skips}


def build_peer(shape: str, dtype: torch.dtype, device: torch.device) -> PeerDecoder:
    return PeerDecoder(PeerConfig.from_dict(shape_config(shape)), 1, 16, dtype, device)


def row_sampling(args) -> SamplingOptions:
    """The rows' sampling parameters from the command line."""
    return SamplingOptions(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                           min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                           logprobs=args.logprobs)


def check_args(parser: argparse.ArgumentParser, args) -> None:
    if args.device == "cpu" and (args.idle or args.kernel_table or args.timeline):
        parser.error("--idle, --kernel-table and --timeline need CUDA")
    if args.peer and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        parser.error("--peer runs one device: not under torchrun")
    sampling = row_sampling(args)
    if sampling.problems():
        parser.error("; ".join(sampling.problems()))
    if not args.temperature and (args.top_p != 1.0 or args.top_k or args.min_p):
        parser.error("--top-p, --top-k and --min-p filter sampled rows: give --temperature "
                     "too (greedy rows take the argmax)")
    if args.temperature and (args.peer or args.spec_tokens):
        parser.error("--temperature samples plain rows only: not with --peer or --spec-tokens "
                     "(the peer and the replayed drafts are greedy)")
    if args.max_loras and args.spec_tokens:
        parser.error("--max-loras times plain decode rows: not with --spec-tokens")
    if args.max_loras < 0:
        parser.error("--max-loras must be >= 0")
    if args.max_lora_rank not in MAX_LORA_RANKS:
        parser.error(f"--max-lora-rank must be one of {', '.join(map(str, MAX_LORA_RANKS))} "
                     f"(the engine's max_lora_rank), got {args.max_lora_rank}")
    if args.variants and (args.peer or args.idle or args.kernel_table or args.profile_host
                          or args.spec_tokens or args.cublas_only):
        parser.error("--variants times plain rows only: not with --peer, --idle, "
                     "--kernel-table, --profile-host, --spec-tokens or --cublas-only")


ROW_WARMUP = 5  # untimed steps before a row's rounds
CHECK_STEPS = 8  # steps of a row's check against eager steps
IDLE_RUN_STEPS = 10  # steps of each of the four --idle measurements
TIMELINE_STEPS = 6  # steps profiled for --timeline (five forwards between them)


@contextlib.contextmanager
def graphs_set_aside(runner: ModelRunner):
    """Every step inside runs eagerly: the runner's captured graphs are set
    aside meanwhile (its step then finds none to replay)."""
    managers = [m for m in (runner.graphs, runner.plain_graphs, runner.prefill_graphs)
                if m is not None]
    captured = [m.graphs for m in managers]
    for m in managers:
        m.graphs = {}
    try:
        yield
    finally:
        for m, graphs in zip(managers, captured):
            m.graphs = graphs


def eager_check(runner: ModelRunner, batch: int, context: int,
                sampling: SamplingOptions = GREEDY) -> dict:
    """The row's tokens (``DecodeDriver``'s with ``sampling``) over
    CHECK_STEPS steps as timed (graph replays where captured) against the
    same steps run eagerly, each from the same random KV cache."""
    def tokens():
        return row_tokens(DecodeDriver(runner, sampling), runner, batch, context,
                          CHECK_STEPS, kv_seed=batch + context)

    timed = tokens()
    with graphs_set_aside(runner):
        eager = tokens()
    return {"steps": CHECK_STEPS, "tokens_equal": timed == eager}


def plain_row_steps(args) -> int:
    """Decode steps a plain row's requests run: warm-up, the timed rounds,
    the --idle and --timeline measurements and the step that feeds the
    last token."""
    return ROW_WARMUP + args.rounds * args.steps + 4 * IDLE_RUN_STEPS + TIMELINE_STEPS + 1


def blocks_for(batch: int, context: int, steps: int, block_size: int) -> int:
    """KV blocks a row's requests take: the context, ``steps`` tokens more
    and a margin for a speculative step's lookahead."""
    return batch * -(-(context + steps + 36) // block_size)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="the rows' requests sample at this temperature, each with a "
                             "seed of its own (0: greedy)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="the sampled rows' top-p (1: off)")
    parser.add_argument("--top-k", type=int, default=0,
                        help="the sampled rows' top-k (0: off)")
    parser.add_argument("--min-p", type=float, default=0.0,
                        help="the sampled rows' min-p (0: off)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="the rows' repetition penalty (1: off), greedy rows too")
    parser.add_argument("--logprobs", type=int, default=None,
                        help="the rows' top logprobs a step (none by default), greedy rows too")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds of --steps steps a row; its step time is their median")
    parser.add_argument("--peer", action="store_true",
                        help="also time the torch.compile'd peer decoder on every row")
    parser.add_argument("--bandwidth-mib", type=int, default=4096,
                        help="buffer the bandwidth kernels stream over")
    parser.add_argument("--idle", action="store_true", help="also measure GPU idle time")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--block-size", type=int, default=EngineConfig.block_size,
                        help="tokens per KV cache block")
    parser.add_argument("--profile-host", action="store_true",
                        help="also print a cProfile of the host side of 50 batch-1 steps")
    parser.add_argument("--timeline", action="store_true",
                        help="also give each row the step's critical path by kernel "
                             "(benchmarks/step_timeline.py)")
    parser.add_argument("--kernel-table", action="store_true",
                        help="also print device time by kernel for batches 1 and the largest")
    parser.add_argument("--no-pdl", action="store_true",
                        help="launch the Triton kernels without programmatic dependent launch")
    parser.add_argument("--cublas-only", action="store_true",
                        help="every projection through cuBLAS at every batch size (no "
                             "skinny or medium Triton matmul, no fused gate/up or qkv), "
                             "to compare")
    parser.add_argument("--disable-custom-all-reduce", action="store_true",
                        help="NCCL for every all-reduce (TP > 1), to compare")
    parser.add_argument("--spec-tokens", type=int, nargs="*", default=[],
                        help="also time speculative steps of 1 + k query tokens, each k")
    parser.add_argument("--spec-proposer", default="replay", choices=("replay", "ngram"))
    parser.add_argument("--replay-accept", type=float, default=0.7,
                        help="replay proposer: share of drafts kept right")
    parser.add_argument("--variants", nargs="+", choices=sorted(decode_variants.VARIANTS),
                        default=None,
                        help="time each row under these kernel variants "
                             "(benchmarks/decode_variants.py), interleaved in one process")
    parser.add_argument("--max-loras", type=int, default=0,
                        help="run every row with LoRA: this many random adapters, one in "
                             "each slot, request i running slot i %% N; then time the same "
                             "rows without LoRA (0: off)")
    parser.add_argument("--max-lora-rank", type=int, default=16,
                        help="the adapters' rank with --max-loras: one of the engine's "
                             "max_lora_rank values")
    parser.add_argument("--out", default=None)
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of --out's earlier run of this shape that this "
                             "run does not repeat (to split a long sweep over several runs)")
    args = parser.parse_args()
    check_args(parser, args)
    with tempfile.TemporaryDirectory(prefix="tprun-shape-") as shape_dir:
        return run_benchmark(args, write_shape(args.shape, shape_dir))


def never_carry_norms(*args) -> bool:
    """``norms_in_matmuls`` of ``--cublas-only``: no forward carries the norms."""
    return False


def use_cublas_everywhere(model: torch.nn.Module) -> None:
    """Every projection of ``model`` through cuBLAS instead of the device's
    choice (skinny or medium Triton matmuls), for ``--cublas-only``: the
    row-parallel ones through ``F.linear``, gate/up as cuBLAS then the SiLU
    kernel, qkv as cuBLAS then the rotary kernel, and the decoder norms
    launched on their own (the matmuls that would carry them are Triton's).
    The modules' own ops are replaced, so nothing global changes."""
    from runner.layers.triton_qkv_rotary import unfused_qkv_rotary_write_kv
    from runner.layers.triton_skinny_matmul import cublas_gate_up_silu

    linear = torch.nn.functional.linear
    replacements = {"row_parallel_matmul": linear, "gate_up_silu": cublas_gate_up_silu,
                    "qkv_rotary_write_kv": functools.partial(unfused_qkv_rotary_write_kv, linear),
                    "norms_in_matmuls": never_carry_norms}
    for module in model.modules():
        if isinstance(getattr(module, "ops", None), runner_ops.DeviceOps):
            module.ops = dataclasses.replace(module.ops, **replacements)


def run_benchmark(args, model_dir: str) -> int:
    """Every row of the sweep, then the summary (rank 0 prints it); 1 if a
    row's timed tokens differ from eager steps' (the summary's
    ``problems``), else 0."""
    device = init_device(args.device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    runner_ops.PDL_ENABLED = not args.no_pdl  # before any kernel is captured
    bandwidth = floor.measure_bandwidth(device, args.bandwidth_mib << 20)
    q_max = 1 + max(args.spec_tokens, default=0)
    max_len = max(args.contexts) + max(plain_row_steps(args),
                                       (args.steps + SPEC_WARMUP + 1) * q_max) + 64
    engine_config = EngineConfig(
        model=model_dir, device=args.device, dtype=args.dtype, max_num_seqs=max(args.batches),
        max_model_len=max_len, max_num_batched_tokens=max(2048, max(args.batches) * q_max),
        load_format="dummy", enforce_eager=args.enforce_eager, block_size=args.block_size,
        disable_custom_all_reduce=args.disable_custom_all_reduce,
        enable_lora=args.max_loras > 0, max_loras=max(args.max_loras, 1),
        max_lora_rank=args.max_lora_rank)
    config = engine_config.runner_config(model_dir, describe(model_dir))
    runner = ModelRunner(config, device, TensorParallelGroup.from_default_group())
    if runner.lora is not None:
        lora_rows.load_random_adapters(runner, args.max_lora_rank,
                                       os.path.join(model_dir, "adapters"))
    if args.cublas_only:  # before the decode graphs are captured
        use_cublas_everywhere(runner.model)
    # Only the blocks the largest row takes, so the peer has room beside them.
    replay_steps = (args.steps + SPEC_WARMUP + 1) * (1 + max(args.spec_tokens, default=0))
    row_steps = max(plain_row_steps(args),
                    replay_steps if args.spec_tokens and args.spec_proposer == "replay" else 0)
    needed = max(blocks_for(b, c, row_steps, config.block_size)
                 for b in args.batches for c in args.contexts)
    num_blocks = agreed_num_blocks(min(runner.determine_num_blocks(), needed), device)
    start = time.perf_counter()
    runner.init_kv_cache(num_blocks)
    init_s = time.perf_counter() - start
    model = runner.model
    params = list(model.parameters())
    kv_per_token = runner.bytes_per_block() // config.block_size
    peer = build_peer(args.shape, runner.dtype, device) if args.peer else None

    results, replay = [], {}
    if args.variants:
        results = variant_rows(args, runner, lambda batch, context: row_floor(
            params, model, kv_per_token, batch, context, bandwidth, runner.lora), num_blocks,
            rank == 0)
    for context in ([] if args.variants else args.contexts):
        for batch in args.batches:
            blocks_needed = blocks_for(batch, context, row_steps, config.block_size)
            row = {"shape": args.shape, "batch": batch, "context": context}
            if blocks_needed > num_blocks:
                row["skipped"] = f"KV of {blocks_needed} blocks does not fit {num_blocks}"
                results.append(row)
                continue
            driver = started_row(runner, args, batch, context)
            rounds = [driver.run(args.steps, overlap=True) for _ in range(args.rounds)]
            step_s = statistics.median(rounds)
            row.update(step_fields(rounds, row_floor(params, model, kv_per_token, batch,
                                                     context, bandwidth, runner.lora), batch),
                       norms_in_matmuls=model.carries_norms(batch))
            if args.timeline:
                row["timeline"] = row_timeline(driver, runner)
            if args.idle:
                row["idle_sync"] = gpu_idle_fraction(driver, IDLE_RUN_STEPS, overlap=False)
                row["idle_async"] = gpu_idle_fraction(driver, IDLE_RUN_STEPS, overlap=True)
                row["between_steps_sync"] = idle_between_steps(driver, IDLE_RUN_STEPS,
                                                               overlap=False)
                row["between_steps_async"] = idle_between_steps(driver, IDLE_RUN_STEPS,
                                                                overlap=True)
            driver.finish()
            if peer is not None:
                row.update(peer_fields(peer, batch, context, args.steps, device, step_s,
                                       row["floor_ms"]))
            row["eager_check"] = eager_check(runner, batch, context, row_sampling(args))
            if args.spec_tokens and args.spec_proposer == "replay":
                replay[batch, context] = row_tokens(
                    DecodeDriver(runner), runner, batch, context, replay_steps)
            results.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)

    if args.profile_host and not dist.is_initialized():  # one rank alone: peers would wait
        profile_host(runner, min(args.contexts), row_sampling(args))
    if args.kernel_table:
        for batch in sorted({1, min(64, max(args.batches))}):
            kernel_table(runner, batch, min(args.contexts), row_sampling(args), show=rank == 0)
    graph_sizes = runner.graphs.sizes
    if runner.lora is not None:
        run_plain_rows(args, runner, results, bandwidth, rank)
    if args.spec_tokens:
        run_spec_rows(args, runner, results, replay, device, rank)
    summary = {
        "benchmark": "decode_step", "shape": args.shape, "device": device_name(device),
        "dtype": args.dtype, "tp": dist.get_world_size() if dist.is_initialized() else 1,
        "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
        "min_p": args.min_p, "repetition_penalty": args.repetition_penalty,
        "logprobs": args.logprobs,
        "bandwidth": bandwidth, "floor": FLOOR_METHOD,
        "weight_GB": round(sum(floor.nbytes(t) for t in floor.unique_tensors(params)) / 1e9, 3),
        "kv_bytes_per_token": kv_per_token,
        "num_blocks": num_blocks, "block_size": config.block_size, "cuda_graphs": not args.enforce_eager,
        "graph_sizes": graph_sizes, "init_kv_and_graphs_s": round(init_s, 2),
        "row_parallel_matmul": "cublas" if args.cublas_only else "device default",
        **({"lora": {"max_loras": args.max_loras, "max_lora_rank": args.max_lora_rank,
                     "rows": "request i runs adapter slot i % max_loras; 'plain' is the "
                             "same row without LoRA"}} if args.max_loras else {}),
        **({"variants": {name: decode_variants.VARIANTS[name].description
                         for name in args.variants}} if args.variants else {}),
        "pdl": runner_ops.launch_pdl(device),
        "custom_all_reduce": runner.tp.peer is not None,
        "date": time.strftime("%Y-%m-%d"), "results": results,
        "problems": [f"batch {r['batch']} x {r['context']}: the timed steps' tokens differ "
                     "from eager steps'" for r in results
                     if "eager_check" in r and not r["eager_check"]["tokens_equal"]] + [
                    f"batch {r['batch']} x {r['context']}: the plain runner's timed steps' "
                    "tokens differ from eager steps'" for r in results
                    if "plain" in r and not r["plain"]["eager_check"]["tokens_equal"]],
    }
    if peer is not None:
        summary["peer"] = {"model": "benchmarks/peer_decoder.py", "torch": torch.__version__,
                           "compile": {"mode": "reduce-overhead", "fullgraph": True,
                                       "dynamic": False}}
    if args.append and args.out:
        summary["results"] = earlier_rows(args.out, args.shape, results) + results
    if rank == 0:
        emit_summary(summary, args.out)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 1 if summary["problems"] else 0


def started_row(runner: ModelRunner, args, batch: int, context: int) -> DecodeDriver:
    """A row's requests added and ROW_WARMUP untimed steps run."""
    driver = DecodeDriver(runner, row_sampling(args))
    driver.start(batch, context, plain_row_steps(args))
    driver.run(ROW_WARMUP, overlap=True)
    return driver


def row_timeline(driver: DecodeDriver, runner: ModelRunner) -> dict:
    """``--timeline``'s field: TIMELINE_STEPS profiled steps of the row."""
    return step_timeline.timeline(step_timeline.kernel_records(driver, TIMELINE_STEPS),
                                  runner.model.config.num_hidden_layers)


def row_floor(params, model, kv_per_token: int, batch: int, context: int,
              bandwidth: dict, lora=None) -> dict:
    """A row's floor fields (``floor.decode_floor``) and the bandwidth used;
    with ``lora`` (the runner's adapters) the bytes of those the row uses
    count too (``lora_rows.step_adapter_bytes``)."""
    weights = floor.decode_weight_bytes(params, model.embed_tokens.weight,
                                        model.lm_head.weight, batch)
    if lora is not None:
        weights += lora_rows.step_adapter_bytes(lora, batch)
    return {**floor.decode_floor(weights, kv_per_token, batch, context, bandwidth),
            "floor_GBps": bandwidth["used_GBps"]}


def step_fields(rounds: list[float], floor_fields: dict, batch: int) -> dict:
    """A row's step time (the median of its rounds' seconds a step), the
    rounds, the floor and the ratio to it, tokens per second."""
    step_s = statistics.median(rounds)
    return dict(step_ms=round(step_s * 1e3, 4), step_ms_rounds=[round(r * 1e3, 4) for r in rounds],
                **floor_fields, ratio_to_floor=round(step_s * 1e3 / floor_fields["floor_ms"], 3),
                tokens_per_s=round(batch / step_s, 1))


def variant_rows(args, runner: ModelRunner, floor_of, num_blocks: int,
                 show: bool) -> list[dict]:
    """Every (batch, context) row under each of ``args.variants``: each
    round runs the variants in turn (in reverse order every other round),
    each with the decode graphs captured anew under it, then the rows. A
    row's figures are the first variant's; ``variants`` holds each one's
    (its rounds, median, ratio to the first, its tokens against eager steps
    under it, and with --timeline its first round's timeline). The default
    code's graphs are captured again at the end."""
    names = args.variants
    runs: dict[tuple, list[float]] = {}
    checks: dict[tuple, dict] = {}
    timelines: dict[tuple, dict] = {}
    shape = [(b, c) for c in args.contexts for b in args.batches
             if blocks_for(b, c, plain_row_steps(args), runner.config.block_size) <= num_blocks]
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            with decode_variants.applied(name):
                runner.capture_graphs()
                for batch, context in shape:
                    driver = started_row(runner, args, batch, context)
                    runs.setdefault((name, batch, context), []).append(
                        driver.run(args.steps, overlap=True))
                    if r == 0 and args.timeline:
                        timelines[name, batch, context] = row_timeline(driver, runner)
                    driver.finish()
                    if r == 0:
                        checks[name, batch, context] = eager_check(runner, batch, context,
                                                                   row_sampling(args))
    runner.capture_graphs()
    rows = []
    for context in args.contexts:
        for batch in args.batches:
            row = {"shape": args.shape, "batch": batch, "context": context}
            if (batch, context) not in shape:
                row["skipped"] = f"KV of the row does not fit {num_blocks} blocks"
                rows.append(row)
                continue
            fields = {name: step_fields(runs[name, batch, context], floor_of(batch, context),
                                        batch) for name in names}
            first = fields[names[0]]
            row.update(first, norms_in_matmuls=runner.model.carries_norms(batch))
            row["variants"] = {name: {
                "step_ms": f["step_ms"], "step_ms_rounds": f["step_ms_rounds"],
                "ratio_to_floor": f["ratio_to_floor"],
                "over_first": round(f["step_ms"] / first["step_ms"], 4),
                "tokens_equal": checks[name, batch, context]["tokens_equal"],
                **({"timeline": timelines[name, batch, context]}
                   if (name, batch, context) in timelines else {})}
                for name, f in fields.items()}
            row["eager_check"] = {"steps": CHECK_STEPS, "tokens_equal": all(
                v["tokens_equal"] for v in row["variants"].values())}
            rows.append(row)
            if show:
                print(json.dumps(row), flush=True)
    return rows


def run_plain_rows(args, lora_runner: ModelRunner, results: list[dict], bandwidth: dict,
                   rank: int) -> None:
    """``--max-loras``: every row that ran, timed again by a runner without
    LoRA (same config otherwise, built after the LoRA runner's KV cache and
    graphs are freed); adds ``plain`` (its step time, floor, check against
    eager steps) and ``lora_over_plain`` to the rows."""
    device, tp = lora_runner.device, lora_runner.tp
    lora_runner.kv_caches, lora_runner.graphs.graphs, lora_runner.graphs.pool = [], {}, None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    runner = ModelRunner(msgspec.structs.replace(lora_runner.config, lora=None), device, tp)
    timed = [r for r in results if "step_ms" in r]
    if not timed:
        return
    needed = max(blocks_for(r["batch"], r["context"], plain_row_steps(args),
                            runner.config.block_size) for r in timed)
    runner.init_kv_cache(agreed_num_blocks(min(runner.determine_num_blocks(), needed), device))
    params = list(runner.model.parameters())
    kv_per_token = runner.bytes_per_block() // runner.config.block_size
    for row in timed:
        batch, context = row["batch"], row["context"]
        driver = started_row(runner, args, batch, context)
        rounds = [driver.run(args.steps, overlap=True) for _ in range(args.rounds)]
        driver.finish()
        fields = step_fields(rounds, row_floor(params, runner.model, kv_per_token, batch,
                                               context, bandwidth), batch)
        row["plain"] = {key: fields[key] for key in ("step_ms", "step_ms_rounds", "floor_ms",
                                                      "ratio_to_floor")}
        row["plain"]["eager_check"] = eager_check(runner, batch, context, row_sampling(args))
        row["lora_over_plain"] = round(row["step_ms"] / fields["step_ms"], 4)
        if rank == 0:
            print(json.dumps({"batch": batch, "context": context, "plain": row["plain"],
                              "lora_over_plain": row["lora_over_plain"]}), flush=True)


SPEC_WARMUP = 5


def run_spec_rows(args, plain: ModelRunner, results: list[dict], replay: dict,
                  device: torch.device, rank: int) -> None:
    """For each k of ``--spec-tokens``: a speculative runner like ``plain``
    (built after ``plain``'s KV cache and graphs are freed), timed on every
    row that ran; adds ``spec[k]`` to the rows."""
    tp = plain.tp
    plain.kv_caches, plain.graphs.graphs, plain.graphs.pool = [], {}, None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for k in args.spec_tokens:
        runner = spec_runner(plain, k, device, tp)
        steps = (args.steps + SPEC_WARMUP + 1) * (1 + k)
        needed = max(blocks_for(r["batch"], r["context"], steps, plain.config.block_size)
                     for r in results if "step_ms" in r)
        runner.init_kv_cache(agreed_num_blocks(min(runner.determine_num_blocks(), needed),
                                               device))
        for row in results:
            if "step_ms" not in row:
                continue
            batch, context = row["batch"], row["context"]
            zero_kv(runner)
            driver = SpecDecodeDriver(DecodeDriver, runner, k)
            driver.start(batch, context, args.steps + SPEC_WARMUP + 1)
            if args.spec_proposer == "replay":
                install_replay(runner, replay[batch, context], context, args.replay_accept)
            driver.run(SPEC_WARMUP)
            driver.emitted = driver.rows = 0
            step_s = driver.run(args.steps)
            driver.finish()
            per_step = driver.emitted / max(driver.rows, 1)
            row.setdefault("spec", {})[str(k)] = {
                "proposer": args.spec_proposer,
                "replay_accept": args.replay_accept if args.spec_proposer == "replay" else None,
                "step_ms": round(step_s * 1e3, 4),
                "verify_cost": round(step_s * 1e3 / row["step_ms"], 3),
                "tokens_per_step": round(per_step, 3),
                "acceptance_rate": round((per_step - 1) / k, 4),
                "ms_per_output_token": round(step_s * 1e3 / per_step, 4),
                "tokens_per_s": round(batch * per_step / step_s, 1),
                "plain_ms_per_output_token": row["step_ms"],
            }
            if rank == 0:
                print(json.dumps({"batch": batch, "context": context, "k": k,
                                  **row["spec"][str(k)]}), flush=True)
        del runner
        if device.type == "cuda":
            torch.cuda.empty_cache()


def earlier_rows(path: str, shape: str, results: list[dict]) -> list[dict]:
    """Rows of the summary at ``path`` for ``shape`` whose (batch, context)
    ``results`` does not have; none when there is no such file."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        earlier = json.loads(f.read().strip().splitlines()[-1])
    if earlier.get("shape") != shape:
        raise SystemExit(f"{path} holds shape {earlier.get('shape')!r}, not {shape!r}")
    done = {(r["batch"], r["context"]) for r in results}
    return [r for r in earlier["results"] if (r["batch"], r["context"]) not in done]


FLOOR_METHOD = ("bytes read per step (weights except the embedding table, one embedding row "
                "per token, KV of the batch) / bandwidth['used_GBps']")


if __name__ == "__main__":
    sys.exit(main())
