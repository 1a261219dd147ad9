"""All-reduce alone: the one-shot kernel over peer memory against NCCL.

    python -m torch.distributed.run --nproc-per-node 2 -m benchmarks.bench_allreduce \
        --out benchmarks/results/allreduce_tp2.json

bf16 messages of 8 KB to 32 MB (rows of 4096 values), each timed inside a
CUDA graph that holds ``--calls`` back-to-back reductions (launch gaps as in a
decode graph), replayed ``--replays`` times; the median replay over the calls
is one call's time. The one-shot path runs only where it takes the message
(``PeerBuffers.takes``); every row also times the fused all-reduce + residual
add + RMSNorm against NCCL followed by the norm kernel. Each timed output is
checked against NCCL's sum first. Rank 0 prints and writes the JSON.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist

from benchmarks.common import emit_summary, init_device
from runner.custom_all_reduce import MAX_BYTES, MAX_PROGRAMS, PeerBuffers
from runner.layers.triton_rms_norm import rms_norm_triton

HIDDEN = 4096


def graph_time_us(fn, calls: int, replays: int) -> float:
    """Median time of one ``fn()`` inside a graph of ``calls`` back-to-back calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def measure(peer: PeerBuffers, rows: int, g: torch.Generator, calls: int, replays: int) -> dict:
    """One message size: NCCL (alone and followed by the norm) and, where it
    takes the message, the one-shot kernel (alone and fused with the norm)."""
    device = g.device
    x = torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16, generator=g)
    residual = torch.randn_like(x)
    weight = torch.randn(HIDDEN, device=device, dtype=torch.bfloat16, generator=g)
    row = dict(bytes=x.numel() * x.element_size(), rows=rows, tp=dist.get_world_size())
    scratch = x.clone()

    def nccl():
        scratch.copy_(x)
        dist.all_reduce(scratch)

    def nccl_norm():
        nccl()
        rms_norm_triton(scratch, weight, 1e-5, residual)

    row["nccl_us"] = graph_time_us(nccl, calls, replays)
    row["nccl_norm_us"] = graph_time_us(nccl_norm, calls, replays)
    if peer.takes(x):
        want = x.clone()
        dist.all_reduce(want)
        got = peer.all_reduce(x)
        torch.cuda.synchronize()
        row["checked_equal_to_nccl"] = bool(torch.equal(got, want))
        row["custom_us"] = graph_time_us(lambda: peer.all_reduce(x), calls, replays)
        row["fused_norm_us"] = graph_time_us(
            lambda: peer.all_reduce_add_rms_norm(x, residual, weight, 1e-5), calls, replays)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    device = init_device("cuda")
    rank = device.index
    peer = PeerBuffers.create(device)
    rows_list = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    results = []
    g = torch.Generator(device=device).manual_seed(rank)
    for rows in rows_list:
        row = measure(peer, rows, g, args.calls, args.replays)
        results.append(row)
        if rank == 0:
            print(row, flush=True)
    if rank == 0:
        emit_summary(dict(benchmark="allreduce", gpu=torch.cuda.get_device_name(device),
                          torch=torch.__version__, hidden=HIDDEN, max_programs=MAX_PROGRAMS,
                          max_bytes=MAX_BYTES, calls_per_graph=args.calls, rows=results),
                     args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
