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
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import triton

import runner.ops as runner_ops
from benchmarks.common import emit_summary
from runner.layers.rotary import RotaryEmbedding
from runner.layers.triton_qkv_rotary import skinny_qkv_rotary_write_kv, uses_skinny_qkv_rotary
from runner.layers.triton_rotary import rotary_write_kv_triton
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


QKV_ROTARY_SWEEP = [dict(block_p=p, block_k=k, num_warps=4, num_stages=s)
                    for p, k, s in itertools.product((16, 32), (128, 256, 512), (3, 4, 5))]
# (query heads, kv heads, head_dim) of the qkv projection at TP=1.
HEADS = {"8b": (32, 8, 128), "1b": (32, 8, 64)}


def measure_qkv_rotary(shape: str, k: int, m: int) -> dict:
    """The attention's qkv projection, rotary and KV-cache write: cuBLAS then
    the rotary kernel (two launches, the projection through memory) against
    one skinny launch that rotates and stores in its epilogue, at its default
    tile and the best of QKV_ROTARY_SWEEP."""
    hq, hk, head_dim = HEADS[shape]
    n = (hq + 2 * hk) * head_dim
    copies = max(2, -(-(512 << 20) // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
               for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    rope = RotaryEmbedding(head_dim, 4096, 500000.0, None).cuda()
    positions = torch.arange(100, 100 + m, device="cuda")
    slots = torch.arange(16 * m, 17 * m, device="cuda")
    cache = torch.zeros(2, 64, 16, hk, head_dim, device="cuda", dtype=torch.bfloat16)

    def unfused(w):
        heads = (x @ w.T).unflatten(-1, (-1, head_dim))
        q, kk, v = heads.split([hq, hk, hk], dim=1)
        return rotary_write_kv_triton(positions, q, kk, v, rope.cos, rope.sin, cache, slots)

    def fused(x_, w, **config):
        return skinny_qkv_rotary_write_kv(x_, w, positions, rope.cos, rope.sin, cache, slots,
                                          hq, hk, **config).flatten(1)

    want = unfused(weights[0]).flatten(1).float()
    timings = sweep(fused, x, weights, want, QKV_ROTARY_SWEEP, 2e-2, "cuBLAS + rotary")
    row = fused_row(shape, "qkv+rotary+kv_write", m, n * k * 2, time_ms(unfused, weights),
                    timings)
    return row | {"runner_uses_fused": uses_skinny_qkv_rotary(x, weights[0], head_dim)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--shapes", nargs="+", default=["8b", "1b"], choices=sorted(PROJECTIONS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    # Each kernel is timed alone: chained launches of one kernel with
    # programmatic dependent launch overlap each launch's wait with the one
    # before it, which is not how the model chains them (bench_decode --no-pdl
    # measures the chaining).
    runner_ops.PDL_ENABLED = False
    results = []
    for shape in args.shapes:
        for (name, n, k), m in itertools.product(PROJECTIONS[shape], args.rows):
            row = measure(shape, name, n, k, m)
            results.append(row)
            print(json.dumps(row), flush=True)
            fused = {"gate_up": lambda: measure_gate_up_silu(shape, n, k, m),  # noqa: B023
                     "qkv": lambda: measure_qkv_rotary(shape, k, m)}.get(name)  # noqa: B023
            if fused is not None:
                row = fused()
                results.append(row)
                print(json.dumps(row), flush=True)
    emit_summary({"benchmark": "gemv", "device": torch.cuda.get_device_name(),
                  "date": time.strftime("%Y-%m-%d"), "results": results}, args.out)


if __name__ == "__main__":
    main()
