"""Skinny GEMMs (decode projections): cuBLAS against runner's Triton skinny matmul.

    python -m benchmarks.bench_gemv [--rows 1 8] [--shapes 8b 1b]

At batch 1-16 each projection reads its weight once; the question is how close
to the copy bandwidth each implementation gets. Per projection of the
Llama-3.1-8B and Llama-3.2-1B shapes (TP=1) and per row count M, this times
``x @ w.T`` through cuBLAS and through ``runner.layers.triton_skinny_matmul``
(one program per BLOCK_N output columns over the whole of K: no split-K
reduce launch), at its default tile and at the best of a small sweep, as
weight bytes over time. Each timing is a CUDA graph of 200 calls cycling
through enough weight copies that none is read from L2. Prints a JSON
summary last.

The runner takes the skinny kernel for o_proj and down (rows <= 16) when their
outputs are wide enough for the SMs (``runner_uses_triton``: the 8B shape's,
not the 1B's), the fused gate/up + SiLU launch for gate_up, and
the fused qkv + rotary + KV-write launch for qkv (the rows
``gate_up+silu`` and ``qkv+rotary+kv_write`` time those against cuBLAS and
the separate kernel). results/README.md lists the files and how they were
made.

    python -m benchmarks.bench_gemv --medium --rows 32 64 [--shapes 8b 1b]

``--medium`` times instead, for 17..64 rows, every projection through cuBLAS
(gate_up: cuBLAS then the SiLU kernel) against
``runner.layers.triton_medium_matmul`` (gate_up: its fused SiLU epilogue) at
its default config and at each config of ``medium_sweep`` (or of
``--medium-configs``), then the fastest few again with TMA weight tiles.
After qkv, the row ``qkv+rotary+kv_write`` times the attention's qkv
projection with its rotary and KV write three ways: cuBLAS then the rotary
kernel, the medium matmul (at the qkv shape's ``TUNED_CONFIGS`` config) then
the rotary kernel, and the one-launch medium kernel with the rotary epilogue
(``medium_qkv_rotary_write_kv``) at its default and a sweep of its own
(``QKV_ROTARY_SPACE``). ``--projections`` picks rows here too, e.g.
``--medium --projections qkv+rotary+kv_write``. The configs are compiled
first by ``--compile-workers`` processes into Triton's cache (compiling
dominates the sweep otherwise). Each row names its ``TUNED_CONFIGS`` key
and best config, to paste into the table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time

import torch
import triton

import runner.ops as runner_ops
from benchmarks.common import emit_summary
from runner.layers.rotary import RotaryEmbedding
from runner.layers.triton_medium_matmul import (
    DEFAULT_CONFIGS,
    m_pad,
    medium_config,
    medium_gate_up_silu,
    medium_matmul,
    medium_qkv_rotary_write_kv,
    uses_medium_matmul,
    uses_medium_qkv_rotary,
)
from runner.layers.triton_qkv_rotary import (
    skinny_qkv_rotary_write_kv,
    unfused_qkv_rotary_write_kv,
    uses_skinny_qkv_rotary,
)
from runner.layers.triton_silu_mul import silu_mul_triton
from runner.layers.triton_skinny_matmul import (
    skinny_gate_up_silu,
    skinny_matmul,
    uses_skinny_matmul,
)

# (name, out features N, in features K) of the projections at TP=1.
PROJECTIONS = {
    "8b": [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096),
           ("down", 4096, 14336)],
    "1b": [("qkv", 3072, 2048), ("o_proj", 2048, 2048), ("gate_up", 16384, 2048),
           ("down", 2048, 8192)],
}
SWEEP = [dict(block_n=n, block_k=k, num_warps=w, num_stages=s)
         for n, k, w, s in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (2, 3, 4, 5))]


def time_ms(fn, weights: list[torch.Tensor], iters: int = 200) -> float:
    """Mean time of ``fn(w)`` over a CUDA graph of ``iters`` calls (no launch
    gaps from the host), cycling through ``weights`` so that no call finds its
    matrix in the L2 cache."""
    fn(weights[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            fn(weights[i % len(weights)])
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / iters


def sweep(kernel, x, weights, want, configs, atol: float, what: str) -> dict[str, float]:
    """ms of ``kernel(x, w, **config)`` for the default config ({}) and each
    of ``configs`` that fits in shared memory, each checked against ``want``
    first; keyed by the config's JSON."""
    timings = {}
    for config in [{}] + configs:
        try:
            got = kernel(x, weights[0], **config)
        except triton.runtime.errors.OutOfResources:
            continue  # a tile whose pipeline stages exceed shared memory
        if not torch.allclose(got.float(), want, rtol=2e-2, atol=atol):
            raise RuntimeError(f"{kernel.__name__} {config} disagrees with {what}")
        timings[json.dumps(config)] = time_ms(
            lambda w: kernel(x, w, **config), weights)  # noqa: B023
    return timings


def measure(shape: str, name: str, n: int, k: int, m: int) -> dict:
    copies = max(2, -(-(512 << 20) // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

    def cublas(w):
        return x @ w.T

    timings = sweep(skinny_matmul, x, weights, cublas(weights[0]).float(), SWEEP, 2e-1,
                    f"cuBLAS on {name}")
    best_config = min(timings, key=timings.get)
    cublas_ms, default_ms, best_ms = time_ms(cublas, weights), timings["{}"], timings[best_config]
    weight_bytes = n * k * 2
    return {"shape": shape, "projection": name, "rows": m, "weight_MB": round(weight_bytes / 1e6, 1),
            "cublas_us": round(cublas_ms * 1e3, 2), "triton_us": round(default_ms * 1e3, 2),
            "triton_best_us": round(best_ms * 1e3, 2),
            "cublas_TBps": round(weight_bytes / cublas_ms / 1e9, 2),
            "triton_TBps": round(weight_bytes / default_ms / 1e9, 2),
            "triton_best_TBps": round(weight_bytes / best_ms / 1e9, 2),
            "runner_uses_triton": uses_skinny_matmul(x, weights[0]),
            "best": json.loads(best_config)}


GATE_UP_SWEEP = [dict(block_n=n, block_k=k, num_warps=w, num_stages=s)
                 for n, k, w, s in itertools.product((16, 32), (128, 256), (4, 8), (3, 4))]


def measure_gate_up_silu(shape: str, n: int, k: int, m: int) -> dict:
    """The MLP's gate/up projection and its activation: cuBLAS then the SiLU
    kernel (two launches, the [M, 2I] projection through memory) against
    one skinny launch with SiLU in its epilogue, at its default tile and the
    best of GATE_UP_SWEEP."""
    copies = max(2, -(-(512 << 20) // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
               for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    want = silu_mul_triton(x @ weights[0].T).float()
    timings = sweep(skinny_gate_up_silu, x, weights, want, GATE_UP_SWEEP, 2e-2,
                    "the unfused pair")
    unfused_ms = time_ms(lambda w: silu_mul_triton(x @ w.T), weights)
    return fused_row(shape, "gate_up+silu", m, n * k * 2, unfused_ms, timings)


def fused_row(shape: str, projection: str, m: int, weight_bytes: int, unfused_ms: float,
              timings: dict[str, float]) -> dict:
    """A fused launch against its unfused pair: microseconds and TB/s of the
    pair, of the fused kernel's default tile ("{}" in ``timings``) and of
    its best."""
    best = min(timings, key=timings.get)
    return {"shape": shape, "projection": projection, "rows": m,
            "weight_MB": round(weight_bytes / 1e6, 1),
            "unfused_us": round(unfused_ms * 1e3, 2),
            "fused_us": round(timings["{}"] * 1e3, 2),
            "fused_best_us": round(timings[best] * 1e3, 2),
            "unfused_TBps": round(weight_bytes / unfused_ms / 1e9, 2),
            "fused_TBps": round(weight_bytes / timings["{}"] / 1e9, 2),
            "best": json.loads(best)}


QKV_ROTARY_SWEEP = ([dict(block_p=p, block_k=k, num_warps=4, num_stages=s)
                     for p, k, s in itertools.product((16, 32), (128, 256, 512), (3, 4, 5))]
                    + [dict(block_p=p, block_k=256, num_warps=4, num_stages=4, split_k=s)
                       for p, s in itertools.product((16, 32), (1, 2, 3, 4))])
# (query heads, kv heads, head_dim) of the qkv projection at TP=1.
HEADS = {"8b": (32, 8, 128), "1b": (32, 8, 64)}


class QkvRotaryCase:
    """The inputs of a qkv + rotary + KV-write timing of ``shape``'s heads
    over K = k at m rows: weight copies (enough that none is read from L2),
    x, the rotary tables, positions, slots and a bf16 cache."""

    def __init__(self, shape: str, k: int, m: int) -> None:
        self.hq, self.hk, self.head_dim = HEADS[shape]
        self.n = (self.hq + 2 * self.hk) * self.head_dim
        copies = max(2, -(-(512 << 20) // (self.n * k * 2)))
        self.weights = [torch.randn(self.n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
                        for _ in range(copies)]
        self.x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        rope = RotaryEmbedding(self.head_dim, 4096, 500000.0, None).cuda()
        self.cos, self.sin = rope.cos, rope.sin
        self.positions = torch.arange(100, 100 + m, device="cuda")
        self.slots = torch.arange(16 * m, 17 * m, device="cuda")
        self.cache = torch.zeros(2, 64, 16, self.hk, self.head_dim, device="cuda",
                                 dtype=torch.bfloat16)

    def fused(self, launcher):
        """``launcher`` (a fused qkv launch) as a ``sweep`` kernel: (x, w,
        **config) -> q flattened to [M, Hq * D]."""
        def run(x, w, **config):
            return launcher(x, w, self.positions, self.cos, self.sin, self.cache, self.slots,
                            self.hq, self.hk, **config).flatten(1)
        run.__name__ = launcher.__name__
        return run

    def unfused(self, matmul):
        """w -> q through ``matmul(x, w)`` and then the rotary kernel."""
        return lambda w: unfused_qkv_rotary_write_kv(
            matmul, self.x, w, self.positions, self.cos, self.sin, self.cache, self.slots,
            self.hq, self.hk)


def measure_qkv_rotary(shape: str, k: int, m: int) -> dict:
    """The attention's qkv projection, rotary and KV-cache write: cuBLAS then
    the rotary kernel (two launches, the projection through memory) against
    one skinny launch that rotates and stores in its epilogue, at its default
    tile and the best of QKV_ROTARY_SWEEP."""
    case = QkvRotaryCase(shape, k, m)
    unfused = case.unfused(lambda x, w: x @ w.T)
    want = unfused(case.weights[0]).flatten(1).float()
    timings = sweep(case.fused(skinny_qkv_rotary_write_kv), case.x, case.weights, want,
                    QKV_ROTARY_SWEEP, 2e-2, "cuBLAS + rotary")
    row = fused_row(shape, "qkv+rotary+kv_write", m, case.n * k * 2,
                    time_ms(unfused, case.weights), timings)
    return row | {"runner_uses_fused": uses_skinny_qkv_rotary(case.x, case.weights[0],
                                                              case.head_dim)}


# The medium sweep's spaces by kind, pruned by medium_sweep. qkv_rotary's
# tile is 2 * block_p weight rows (block_p rotary pairs of one head).
MEDIUM_SPACE = dict(block_n=(64, 128), block_k=(64, 128, 256), split_k=(1, 2, 4),
                    num_warps=(4, 8), num_stages=(3, 4, 5))
QKV_ROTARY_SPACE = dict(block_p=(32, 64), block_k=(64, 128, 256), split_k=(1, 2, 4),
                        num_warps=(4, 8), num_stages=(3, 4, 5))
SMEM_BYTES = 227 * 1024  # shared memory a Hopper block may take
TMA_RETRIES = 3  # the fastest pointer-load configs timed again with TMA tiles
QKV_ROTARY_ROW = "qkv+rotary+kv_write"


def medium_kind(projection: str) -> str:
    """The medium launch (``TUNED_CONFIGS`` kind) of a --medium row."""
    return {"gate_up": "gate_up", QKV_ROTARY_ROW: "qkv_rotary"}.get(projection, "matmul")


def tile_rows(kind: str, config: dict) -> int:
    """Weight rows a program of ``kind`` reads at ``config``."""
    if kind == "qkv_rotary":
        return 2 * config["block_p"]
    return (2 if kind == "gate_up" else 1) * config["block_n"]


def medium_sweep(kind: str, k: int, rows: int, head_dim: int = 0) -> list[dict]:
    """The sweep space's configs a launch of ``kind`` over K = k can take:
    the pipeline's stages (weight and x tiles) within SMEM_BYTES, at least
    MIN_TILES_PER_SPLIT K tiles a split, 8 warps only on 128-row tiles
    (two warp groups each of 64 weight rows) and, for qkv_rotary, block_p
    pairs that tile half of a ``head_dim`` head."""
    from runner.layers.split_k import MIN_TILES_PER_SPLIT

    space = QKV_ROTARY_SPACE if kind == "qkv_rotary" else MEDIUM_SPACE
    configs = []
    for values in itertools.product(*space.values()):
        config = dict(zip(space, values, strict=True))
        w_rows = tile_rows(kind, config)
        stage_bytes = (w_rows + m_pad(rows)) * config["block_k"] * 2
        if (config["num_stages"] * stage_bytes > SMEM_BYTES
                or -(-k // config["block_k"]) // config["split_k"] < MIN_TILES_PER_SPLIT
                or (config["num_warps"] == 8 and w_rows < 128)
                or (kind == "qkv_rotary" and head_dim % w_rows)):
            continue
        configs.append(config)
    return configs


MEDIUM_KERNELS = {"matmul": medium_matmul, "gate_up": medium_gate_up_silu}


def heads_of(n: int) -> tuple[int, int, int]:
    """(Hq, Hkv, head_dim) of the HEADS entry whose qkv weight has n rows."""
    (heads,) = {h for h in HEADS.values() if (h[0] + 2 * h[1]) * h[2] == n}
    return heads


def _compile_configs(tasks: list[tuple[str, int, int, int, dict]]) -> int:
    """A worker of ``precompile``: one launch of each (kind, n, k, rows,
    config) on zeros, which leaves its kernel in Triton's on-disk cache.
    Returns how many compiled (the rest exceed shared memory)."""
    runner_ops.PDL_ENABLED = False
    done = 0
    for kind, n, k, rows, config in tasks:
        w = torch.zeros(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.zeros(rows, k, device="cuda", dtype=torch.bfloat16)
        try:
            if kind == "qkv_rotary":
                hq, hk, head_dim = heads_of(n)
                cache = torch.zeros(2, 1, 16, hk, head_dim, device="cuda", dtype=torch.bfloat16)
                cos = torch.zeros(1, head_dim // 2, device="cuda")
                no_slots = torch.full((rows,), -1, device="cuda")
                medium_qkv_rotary_write_kv(x, w, torch.zeros_like(no_slots), cos, cos, cache,
                                           no_slots, hq, hk, **config)
            else:
                MEDIUM_KERNELS[kind](x, w, **config)
            done += 1
        except triton.runtime.errors.OutOfResources:
            pass
    torch.cuda.synchronize()
    return done


def precompile(tasks: list[tuple[str, int, int, int, dict]], workers: int) -> None:
    """Compile every distinct kernel of ``tasks`` in ``workers`` processes,
    so that the timing process finds each in Triton's cache. Kernels
    differ by kind, row padding and config only (N and K are not constants
    of the kernel; qkv_rotary's head_dim is, so there N too), so each of
    those is compiled once."""
    distinct = {}
    for kind, n, k, rows, config in tasks:
        distinct.setdefault((kind, m_pad(rows), json.dumps(config, sort_keys=True),
                             n if kind == "qkv_rotary" else None),
                            (kind, n, k, rows, config))
    jobs = list(distinct.values())
    if workers <= 1 or len(jobs) < 2:
        _compile_configs(jobs)
        return
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        compiled = sum(pool.map(_compile_configs, [jobs[i::workers] for i in range(workers)]))
    print(f"compiled {compiled} of {len(jobs)} medium kernels in "
          f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


def medium_plan(shapes: list[str], rows: list[int], given: list[dict] | None,
                projections: list[str] | None = None,
                ) -> list[tuple[str, str, int, int, int, list[dict]]]:
    """(shape, projection, n, k, rows, configs) of every timing of --medium:
    each projection, and after qkv the qkv + rotary + KV-write row (n: the
    qkv weight's rows); only the rows ``projections`` names where given
    (gate_up's row is its fused SiLU launch, so "gate_up+silu" names it
    too). ``given`` (--medium-configs) replaces medium_sweep's configs of
    the plain projections."""
    def wanted(name: str) -> bool:
        return (projections is None or name in projections
                or (name == "gate_up" and FUSED_ROWS[name] in projections))

    plan = []
    for shape in shapes:
        for (name, n, k), m in itertools.product(PROJECTIONS[shape], rows):
            if wanted(name):
                plan.append((shape, name, n, k, m, given or medium_sweep(medium_kind(name), k, m)))
            if name == "qkv" and (projections is None or QKV_ROTARY_ROW in projections):
                plan.append((shape, QKV_ROTARY_ROW, n, k, m,
                             medium_sweep("qkv_rotary", k, m, HEADS[shape][2])))
    return plan


def measure_medium(shape: str, name: str, n: int, k: int, m: int, configs: list[dict]) -> dict:
    """One projection at ``m`` rows: cuBLAS (gate_up: then the SiLU kernel)
    against the medium kernel's default config and ``configs``, and the
    TMA_RETRIES fastest of those again with TMA weight tiles."""
    if name == QKV_ROTARY_ROW:
        return measure_medium_qkv_rotary(shape, k, m, configs)
    kind = medium_kind(name)
    kernel = MEDIUM_KERNELS[kind]
    copies = max(2, -(-(512 << 20) // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
               for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

    def cublas(w):
        y = x @ w.T
        return silu_mul_triton(y) if kind == "gate_up" else y

    want = cublas(weights[0]).float()
    timings = sweep(kernel, x, weights, want, configs, 2e-2, f"cuBLAS on {name}")
    pointer = sorted((t, c) for c, t in timings.items() if c != "{}")[:TMA_RETRIES]
    retries = [json.loads(c) | {"tma": True} for _, c in pointer]
    timings |= {c: t for c, t in sweep(kernel, x, weights, want, retries, 2e-2,
                                       f"cuBLAS on {name}").items() if c != "{}"}
    best = min(timings, key=timings.get)
    cublas_ms, default_ms, best_ms = time_ms(cublas, weights), timings["{}"], timings[best]
    weight_bytes = n * k * 2
    return {"shape": shape, "projection": name, "rows": m,
            "weight_MB": round(weight_bytes / 1e6, 1),
            "cublas_us": round(cublas_ms * 1e3, 2), "medium_us": round(default_ms * 1e3, 2),
            "medium_best_us": round(best_ms * 1e3, 2),
            "cublas_GBps": round(weight_bytes / cublas_ms / 1e6),
            "medium_GBps": round(weight_bytes / default_ms / 1e6),
            "medium_best_GBps": round(weight_bytes / best_ms / 1e6),
            "configs_timed": len(timings),
            "runner_uses_medium": uses_medium_matmul(x, weights[0], kind),
            "default": medium_config(kind, n, k, m),
            "table_key": [kind, n, k, m_pad(m)], "best": json.loads(best)}


def measure_medium_qkv_rotary(shape: str, k: int, m: int, configs: list[dict]) -> dict:
    """The qkv projection, rotary and KV write at ``m`` rows three ways:
    cuBLAS then the rotary kernel; the medium matmul at the qkv shape's
    ``TUNED_CONFIGS`` config (the default where that says cuBLAS) then the
    rotary kernel; and the one-launch medium kernel at its default config
    and ``configs``, each checked against the first."""
    case = QkvRotaryCase(shape, k, m)
    n, x, weights = case.n, case.x, case.weights
    matmul_config = medium_config("matmul", n, k, m) or DEFAULT_CONFIGS["matmul"]
    cublas = case.unfused(lambda x_, w: x_ @ w.T)
    medium = case.unfused(lambda x_, w: medium_matmul(x_, w, **matmul_config))
    want = cublas(weights[0]).flatten(1).float()
    if not torch.allclose(medium(weights[0]).flatten(1).float(), want, rtol=2e-2, atol=2e-2):
        raise RuntimeError(f"medium matmul + rotary {matmul_config} disagrees with cuBLAS + rotary")
    timings = sweep(case.fused(medium_qkv_rotary_write_kv), x, weights, want, configs, 2e-2,
                    "cuBLAS + rotary")
    best = min(timings, key=timings.get)
    cublas_ms, medium_ms = time_ms(cublas, weights), time_ms(medium, weights)
    default_ms, best_ms = timings["{}"], timings[best]
    weight_bytes = n * k * 2
    return {"shape": shape, "projection": QKV_ROTARY_ROW, "rows": m,
            "weight_MB": round(weight_bytes / 1e6, 1),
            "cublas_rotary_us": round(cublas_ms * 1e3, 2),
            "medium_rotary_us": round(medium_ms * 1e3, 2),
            "fused_us": round(default_ms * 1e3, 2), "fused_best_us": round(best_ms * 1e3, 2),
            "cublas_rotary_GBps": round(weight_bytes / cublas_ms / 1e6),
            "medium_rotary_GBps": round(weight_bytes / medium_ms / 1e6),
            "fused_GBps": round(weight_bytes / default_ms / 1e6),
            "fused_best_GBps": round(weight_bytes / best_ms / 1e6),
            "configs_timed": len(timings),
            "runner_uses_fused": uses_medium_qkv_rotary(x, weights[0], case.head_dim),
            "medium_rotary_config": matmul_config,
            "default": medium_config("qkv_rotary", n, k, m),
            "table_key": ["qkv_rotary", n, k, m_pad(m)], "best": json.loads(best)}


def run_medium(args) -> list[dict]:
    """--medium: every planned row, printed as it is measured."""
    given = json.loads(args.medium_configs) if args.medium_configs else None
    plan = medium_plan(args.shapes, args.rows, given, args.projections)
    tasks = [(medium_kind(name), n, k, m, config | tma)
             for _, name, n, k, m, configs in plan for config in configs
             for tma in ({}, {"tma": True}) if not (tma and name == QKV_ROTARY_ROW)]
    precompile(tasks, args.compile_workers)
    results = []
    for plan_row in plan:
        row = measure_medium(*plan_row)
        results.append(row)
        print(json.dumps(row), flush=True)
    return results


# The fused launch timed after each projection's plain row, by the rows' names.
FUSED_ROWS = {"gate_up": "gate_up+silu", "qkv": "qkv+rotary+kv_write"}


def run_skinny(args) -> list[dict]:
    """Without --medium: the skinny kernels and their fused variants (the rows
    ``--projections`` names; all without it)."""
    def wanted(row_name: str) -> bool:
        return args.projections is None or row_name in args.projections

    results = []
    for shape in args.shapes:
        for (name, n, k), m in itertools.product(PROJECTIONS[shape], args.rows):
            if wanted(name):
                row = measure(shape, name, n, k, m)
                results.append(row)
                print(json.dumps(row), flush=True)
            if wanted(FUSED_ROWS.get(name, "")):
                row = (measure_gate_up_silu(shape, n, k, m) if name == "gate_up"
                       else measure_qkv_rotary(shape, k, m))
                results.append(row)
                print(json.dumps(row), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=None,
                        help="row counts (default 1 4 8 16; with --medium 32 64)")
    parser.add_argument("--shapes", nargs="+", default=["8b", "1b"], choices=sorted(PROJECTIONS))
    parser.add_argument("--projections", nargs="+", default=None,
                        choices=sorted({name for rows in PROJECTIONS.values()
                                        for name, _, _ in rows} | set(FUSED_ROWS.values())),
                        help="only these rows (default: every projection and fused launch; "
                             "with --medium, gate_up's row is its fused SiLU launch)")
    parser.add_argument("--medium", action="store_true",
                        help="time the 17..64-row medium kernels against cuBLAS instead")
    parser.add_argument("--medium-configs", default=None,
                        help="--medium: a JSON list of configs to time instead of the sweep "
                             "(the plain projections' rows)")
    parser.add_argument("--compile-workers", type=int, default=min(16, os.cpu_count() or 1),
                        help="--medium: processes compiling the sweep's kernels first")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.rows is None:
        args.rows = [32, 64] if args.medium else [1, 4, 8, 16]
    if args.medium and not all(17 <= m <= 64 for m in args.rows):
        parser.error("--medium times 17..64 rows")
    if not torch.cuda.is_available():
        sys.exit("bench_gemv: needs a CUDA device (none is visible)")
    # Each kernel is timed alone: chained launches of one kernel with
    # programmatic dependent launch overlap each launch's wait with the one
    # before it, which is not how the model chains them (bench_decode --no-pdl
    # measures the chaining).
    runner_ops.PDL_ENABLED = False
    results = run_medium(args) if args.medium else run_skinny(args)
    emit_summary({"benchmark": "gemv_medium" if args.medium else "gemv",
                  "device": torch.cuda.get_device_name(),
                  "date": time.strftime("%Y-%m-%d"), "results": results}, args.out)


if __name__ == "__main__":
    main()
