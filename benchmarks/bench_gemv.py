"""Skinny GEMMs (decode projections): cuBLAS against a Triton skinny matmul.

    python benchmarks/bench_gemv.py [--rows 1 8] [--shapes 8b 1b]

At batch 1-8 each projection reads its weight once; the question is how close
to the copy bandwidth each implementation gets. Per projection of the
Llama-3.1-8B and Llama-3.2-1B shapes (TP=1) and per row count M, this times
``x @ w.T`` through cuBLAS and through ``skinny_matmul`` below (one program
per BLOCK_N output columns over the whole of K: no split-K reduce launch), at
the block width ``choose_block_n`` picks and at the best of a small sweep, as
weight bytes over time. ``down+silu`` is the MLP's tail: cuBLAS's time
includes the separate SiLU-and-multiply launch, the Triton kernel computes
silu(gate) * up while loading its input. Each timing is a CUDA graph of 200
calls cycling through enough weight copies that none is read from L2.
Prints a JSON summary last.

An experiment the runner does not use. On the H200 (results/gemv.json): only
o_proj gains (8B 11.2 vs 12.5 us, about 40 us per step at batch 1); qkv and
gate_up are slower than cuBLAS, and fusing SiLU into the input load makes
down 5x slower (the computed operand breaks the pipelining of the weight
loads), so the runner keeps cuBLAS and the separate SiLU kernel.
"""

from __future__ import annotations

import argparse
import functools
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
from runner.layers.triton_silu_mul import silu_mul_triton  # noqa: E402

# (name, out features N, in features K) of the projections at TP=1.
PROJECTIONS = {
    "8b": [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096),
           ("down+silu", 4096, 14336)],
    "1b": [("qkv", 3072, 2048), ("o_proj", 2048, 2048), ("gate_up", 16384, 2048),
           ("down+silu", 2048, 8192)],
}
SWEEP = [dict(block_n=n, block_k=k, num_warps=w)
         for n, k, w in itertools.product((8, 16, 32), (256, 512), (4, 8))]


@triton.jit
def _skinny_matmul_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_x, stride_w, stride_out,
                          SILU_MUL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                          M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m, n] = sum_k a[m, k] w[n, k] for BLOCK_N columns and every row, where
    a = x, or a = silu(x[:, :K]) * x[:, K:] with SILU_MUL."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, M_PAD)
    row_mask = rows < M
    col_mask = cols < N
    acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x_mask = row_mask[:, None] & (ks[None, :] < K)
        x_off = rows[:, None] * stride_x + ks[None, :]
        a = tl.load(x_ptr + x_off, mask=x_mask, other=0.0)
        if SILU_MUL:
            gate = a.to(tl.float32)
            up = tl.load(x_ptr + x_off + K, mask=x_mask, other=0.0).to(tl.float32)
            silu = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)
            a = (silu * up).to(x_ptr.dtype.element_ty)
        w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + ks[None, :],
                    mask=col_mask[:, None] & (ks[None, :] < K), other=0.0)
        acc += tl.dot(a, tl.trans(w), input_precision=DOT_PRECISION)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_block_n(n: int, device: torch.device) -> int:
    """Widest column block (32, 16 or 8) that still gives about one program
    per SM; narrower blocks only for small N (e.g. the 1B shape's 2048)."""
    if device.type != "cuda":
        return 16
    busy = 3 * _num_sms(device.index or 0) // 4
    for block_n in (32, 16):
        if triton.cdiv(n, block_n) >= busy:
            return block_n
    return 8


def skinny_matmul(x: torch.Tensor, w: torch.Tensor, silu_mul: bool = False,
                  block_n: int | None = None, block_k: int = 512,
                  num_warps: int = 4) -> torch.Tensor:
    """x [M, K] @ w[N, K].T for M <= 16 rows; with ``silu_mul`` x is [M, 2K]
    (gate then up) and the product uses silu(gate) * up. Unit last strides."""
    m = x.shape[0]
    n, k = w.shape
    if m > 16:
        raise ValueError(f"skinny_matmul takes at most 16 rows, got {m}")
    if x.shape[1] != (2 * k if silu_mul else k):
        raise ValueError(f"input width {x.shape[1]} does not fit weight {tuple(w.shape)}"
                         f"{' (gate|up: 2K)' if silu_mul else ''}")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("skinny_matmul needs unit last strides")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_n = block_n or choose_block_n(n, x.device)
    _skinny_matmul_kernel[(triton.cdiv(n, block_n),)](
        x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        SILU_MUL=silu_mul, M_PAD=16,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    return out


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


def measure(shape: str, name: str, n: int, k: int, m: int) -> dict:
    silu = name.endswith("+silu")
    copies = max(2, -(-(512 << 20) // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(m, 2 * k if silu else k, device="cuda", dtype=torch.bfloat16)
    if silu:
        def cublas(w):
            return silu_mul_triton(x) @ w.T
    else:
        def cublas(w):
            return x @ w.T
    want = cublas(weights[0]).float()
    timings = {}
    for config in [{}] + SWEEP:
        got = skinny_matmul(x, weights[0], silu_mul=silu, **config)
        if not torch.allclose(got.float(), want, rtol=2e-2, atol=2e-1):
            raise RuntimeError(f"skinny_matmul {config} disagrees with cuBLAS on {name}")
        timings[json.dumps(config)] = time_ms(
            lambda w: skinny_matmul(x, w, silu_mul=silu, **config), weights)  # noqa: B023
    best_config = min(timings, key=timings.get)
    cublas_ms, chosen_ms, best_ms = time_ms(cublas, weights), timings["{}"], timings[best_config]
    weight_bytes = n * k * 2
    return {"shape": shape, "projection": name, "rows": m, "weight_MB": round(weight_bytes / 1e6, 1),
            "cublas_us": round(cublas_ms * 1e3, 2), "triton_us": round(chosen_ms * 1e3, 2),
            "triton_best_us": round(best_ms * 1e3, 2),
            "cublas_TBps": round(weight_bytes / cublas_ms / 1e9, 2),
            "triton_TBps": round(weight_bytes / chosen_ms / 1e9, 2),
            "chosen_block_n": choose_block_n(n, x.device), "best": json.loads(best_config)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--shapes", nargs="+", default=["8b", "1b"], choices=sorted(PROJECTIONS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    for shape in args.shapes:
        for (name, n, k), m in itertools.product(PROJECTIONS[shape], args.rows):
            row = measure(shape, name, n, k, m)
            results.append(row)
            print(json.dumps(row), flush=True)
    emit_summary({"benchmark": "gemv", "device": torch.cuda.get_device_name(),
                  "date": time.strftime("%Y-%m-%d"), "results": results}, args.out)


if __name__ == "__main__":
    main()
