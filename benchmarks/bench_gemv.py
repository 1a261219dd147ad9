"""Skinny GEMMs (decode projections) : cuBLAS against a Triton GEMV candidate.

    python benchmarks/bench_gemv.py [--rows 1 4 8]

At batch 1 the 8B shape's qkv and o_proj GEMMs read their weights at
3.1-3.2 TB/s through cuBLAS (plus a split-K reduce launch), against the
4.3 TB/s a device copy moves (benchmarks/results/decode_8b.json, kernel
table). This measures, per projection of the Llama-3.1-8B shape and per row
count M, the time of ``x @ w.T`` by cuBLAS and by ``skinny_matmul`` below
over a few tile configurations, as bandwidth (weight bytes / time). Not used
by the runner: it decides whether a Triton GEMV is worth wiring into the
linear layers for small batches. Prints a JSON summary last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.summary import emit_summary  # noqa: E402

# (name, out features N, in features K) of the Llama-3.1-8B projections at TP=1.
PROJECTIONS = [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096),
               ("down", 4096, 14336)]
CONFIGS = [dict(BLOCK_N=n, BLOCK_K=k, num_warps=w)
           for n, k, w in itertools.product((8, 16, 32), (256, 512), (4, 8))]


@triton.jit
def _skinny_matmul_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_x, stride_w, stride_out,
                          M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m, n] = sum_k x[m, k] w[n, k] for BLOCK_N output columns, all M rows."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, M_PAD)
    acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :],
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + ks[None, :],
                    mask=(cols[:, None] < N) & (ks[None, :] < K), other=0.0)
        acc += tl.dot(x, tl.trans(w))
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def skinny_matmul(x: torch.Tensor, w: torch.Tensor, BLOCK_N: int = 16, BLOCK_K: int = 256,
                  num_warps: int = 4) -> torch.Tensor:
    """x [M, K] @ w[N, K].T for small M (rows padded to 16 for the tensor cores)."""
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _skinny_matmul_kernel[(triton.cdiv(n, BLOCK_N),)](
        x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        M_PAD=max(16, triton.next_power_of_2(m)), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        num_warps=num_warps)
    return out


def time_ms(fn, weights: list[torch.Tensor], iters: int = 200) -> float:
    """Mean time of ``fn(w)`` over a CUDA graph of ``iters`` calls (no launch
    gaps from the host), cycling through ``weights`` so that no call finds its
    matrix in the L2 cache (50 MB: the 8B's o_proj would fit)."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    for (name, n, k), m in itertools.product(PROJECTIONS, args.rows):
        copies = max(2, -(-(512 << 20) // (n * k * 2)))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        w = weights[0]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = x @ w.T
        cublas = time_ms(lambda w: x @ w.T, weights)  # noqa: B023
        best = None
        for config in CONFIGS:
            got = skinny_matmul(x, w, **config)
            if not torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-1):
                raise RuntimeError(f"skinny_matmul {config} disagrees with cuBLAS on {name}")
            ms = time_ms(lambda w: skinny_matmul(x, w, **config), weights)  # noqa: B023
            if best is None or ms < best[0]:
                best = (ms, config)
        row = {"projection": name, "rows": m, "weight_MB": round(w.numel() * 2 / 1e6, 1),
               "cublas_us": round(cublas * 1e3, 2), "triton_us": round(best[0] * 1e3, 2),
               "cublas_TBps": round(w.numel() * 2 / cublas / 1e9, 2),
               "triton_TBps": round(w.numel() * 2 / best[0] / 1e9, 2), "best": best[1]}
        results.append(row)
        print(json.dumps(row), flush=True)
    emit_summary({"benchmark": "gemv", "device": torch.cuda.get_device_name(),
                  "date": time.strftime("%Y-%m-%d"), "results": results}, args.out)


if __name__ == "__main__":
    main()
