"""The one-shot all-reduce over peer memory (runner/custom_all_reduce.py).

On CPU the kernel runs under the Triton interpreter with two "ranks" in one
process: each rank's symmetric buffer is a plain tensor, and the ranks run one
after the other. Rank 0 runs first, so rank 1's half of the exchange (its
staged row and its flag in rank 0's buffer) is written by hand beforehand,
exactly as rank 1's kernel would; rank 1 then runs against what rank 0's
kernel left in its buffer. The reference is the plain torch sum in rank order,
then the residual add and RMSNorm of rms_norm.py.

On two GPUs the kernel runs for real (``gpu`` marker): every size the one-shot
path takes, against NCCL, inside and outside a CUDA graph, and the ranks'
results compared bit for bit.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.kernel_device import KERNEL_DEVICE


def _ref(parts, residual=None, weight=None, eps=1e-5):
    from runner.layers.rms_norm import rms_norm_ref

    acc = torch.zeros(parts[0].shape, dtype=torch.float32, device=parts[0].device)
    for p in parts:
        acc += p.float()
    total = acc.to(parts[0].dtype)
    if residual is None:
        return total, None
    summed = (total.float() + residual.float()).to(total.dtype)
    return rms_norm_ref(summed, weight, eps), summed


def _simulated_ranks(world=2, max_bytes=1 << 14, max_programs=2):
    """``world`` PeerBuffers in one process, over plain device tensors."""
    from runner.custom_all_reduce import PeerBuffers

    size = PeerBuffers.buffer_bytes(world, max_bytes, max_programs)
    buffers = [torch.zeros(size, dtype=torch.uint8, device=KERNEL_DEVICE) for _ in range(world)]
    pointers = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64,
                            device=KERNEL_DEVICE)
    ranks = [PeerBuffers(pointers, r, world, max_bytes, max_programs) for r in range(world)]
    return buffers, ranks


def _stage_as_rank(buffers, ranks, src, x, epoch):
    """Write what rank ``src``'s kernel writes in call ``epoch`` before it waits:
    its rows into its slot of every rank's buffer, and its flags."""
    peer = ranks[src]
    nbytes = x.numel() * x.element_size()
    slot = peer.flag_bytes + ((epoch % 2) * peer.world + src) * peer.max_bytes
    programs = min(x.shape[0], peer.max_programs)
    for b in buffers:
        b[slot:slot + nbytes].view(x.dtype).copy_(x.reshape(-1))
        flags = b[:peer.max_programs * peer.world * 8].view(torch.int64)
        flags.view(peer.max_programs, peer.world)[:programs, src] = epoch


def rms_norm_ref(x, weight, eps):
    from runner.layers.rms_norm import rms_norm_ref as ref

    return ref(x, weight, eps)


def _tolerance(dtype, fused):
    """Exact where rounding is the hardware's; the interpreter rounds bf16 its own
    way (one ulp off at times), and RMSNorm sums its squares in another order."""
    if fused:
        return dict(rtol=1e-2, atol=0.04) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    if dtype == torch.bfloat16 and KERNEL_DEVICE.type == "cpu":
        return dict(rtol=2 ** -7, atol=0.07)
    return dict(rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fused", [False, True])
def test_two_ranks_in_one_process_match_the_rank_ordered_sum(dtype, fused):
    rows, cols, world = 3, 96, 2
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(rows, cols, generator=g).to(dtype).to(KERNEL_DEVICE) for _ in range(world)]
    residual = torch.randn(rows, cols, generator=g).to(dtype).to(KERNEL_DEVICE)
    weight = torch.randn(cols, generator=g).to(dtype).to(KERNEL_DEVICE)
    want, want_residual = _ref(xs, residual if fused else None, weight)

    buffers, ranks = _simulated_ranks(world)  # two programs: one takes rows 0 and 2
    results = []
    for epoch in (1, 2, 3):  # both parities, and a buffer reused after a full cycle
        _stage_as_rank(buffers, ranks, 1, xs[1], epoch)
        outs = []
        for r in range(world):
            if fused:
                res = residual.clone()
                out, res = ranks[r].all_reduce_add_rms_norm(xs[r], res, weight, 1e-5)
                torch.testing.assert_close(res, want_residual, **_tolerance(dtype, False))
                # the norm of the residual the kernel wrote (isolates the norm's numerics)
                torch.testing.assert_close(out, rms_norm_ref(res, weight, 1e-5),
                                           **_tolerance(dtype, True))
            else:
                out = ranks[r].all_reduce(xs[r])
            outs.append(out)
        torch.testing.assert_close(outs[0], want, **_tolerance(dtype, fused))
        assert torch.equal(outs[0], outs[1]), "ranks must agree bit for bit"
        results.append(outs[0])
    assert all(torch.equal(results[0], r) for r in results[1:])
    for rank in ranks:
        assert rank.epochs.tolist() == [3, 3]


def test_takes_only_what_fits():
    _, ranks = _simulated_ranks(2, max_bytes=256)
    peer = ranks[0]
    assert peer.takes(torch.zeros(4, 16, device=KERNEL_DEVICE))
    assert peer.takes(torch.zeros(64, 1, device=KERNEL_DEVICE))
    assert not peer.takes(torch.zeros(4, 17, device=KERNEL_DEVICE))  # bytes
    assert not peer.takes(torch.zeros(8, 2, device=KERNEL_DEVICE)[:, ::2])  # stride
    assert not peer.takes(torch.zeros(0, 8, device=KERNEL_DEVICE))


# ---- two GPUs -------------------------------------------------------------

def _gpu_worker(rank: int, world: int, port: int, result_file: str) -> None:
    import torch.distributed as dist

    from runner.custom_all_reduce import PeerBuffers
    from runner.layers.rms_norm import rms_norm_ref

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=device)
    peer = PeerBuffers.create(device)
    report = []
    try:
        g = torch.Generator(device=device).manual_seed(1234 + rank)
        shared = torch.Generator(device=device).manual_seed(99)  # same on every rank
        cases = [(r, c, dt) for r in (1, 2, 7, 64, 128) for c in (4096, 4000)
                 for dt in (torch.bfloat16, torch.float32)]
        for rows, cols, dtype in cases:
            x = torch.randn(rows, cols, device=device, generator=g).to(dtype)
            if not peer.takes(x):
                continue
            residual = torch.randn(rows, cols, device=device, generator=shared).to(dtype)
            weight = torch.randn(cols, device=device, generator=shared).to(dtype)
            nccl = x.clone()
            dist.all_reduce(nccl)
            got = peer.all_reduce(x)
            res = residual.clone()
            fused, res = peer.all_reduce_add_rms_norm(x, res, weight, 1e-5)
            want_res = (nccl.float() + residual.float()).to(dtype)
            want = rms_norm_ref(want_res, weight, 1e-5)
            mine = torch.cat([got, fused, res])
            gathered = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(gathered, mine)
            same = all(torch.equal(gathered[0], t) for t in gathered)
            report.append(dict(
                rows=rows, cols=cols, dtype=str(dtype), ranks_equal=same,
                vs_nccl=(got.float() - nccl.float()).abs().max().item(),
                fused_err=(fused.float() - want.float()).abs().max().item(),
                residual_err=(res.float() - want_res.float()).abs().max().item(),
            ))
        # inside a CUDA graph: capture once, replay with fresh inputs
        x = torch.empty(8, 4096, device=device, dtype=torch.bfloat16)
        for _ in range(2):  # warm-up outside the graph
            peer.all_reduce(x.normal_())
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = peer.all_reduce(x)
        for _ in range(5):
            x.normal_(generator=g)
            graph.replay()
            nccl = x.clone()
            dist.all_reduce(nccl)
            torch.cuda.synchronize()
            report.append(dict(graph=True, vs_nccl=(out.float() - nccl.float()).abs().max().item()))
    finally:
        torch.cuda.synchronize()
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        import json

        with open(result_file, "w") as f:
            json.dump(report, f)


@pytest.mark.gpu
@pytest.mark.timeout(150)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
def test_two_gpus_match_nccl_bit_for_bit_across_ranks(tmp_path):
    import json
    import socket

    import torch.multiprocessing as mp

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = tmp_path / "report.json"
    mp.spawn(_gpu_worker, args=(2, port, str(result)), nprocs=2, join=True)
    report = json.loads(result.read_text())
    eager = [r for r in report if not r.get("graph")]
    assert len(eager) >= 10
    for r in eager:
        assert r["ranks_equal"], r
        assert r["vs_nccl"] == 0.0, r  # two ranks: one rounding of the float32 sum
        assert r["residual_err"] == 0.0, r
        assert r["fused_err"] <= (0.07 if "bfloat16" in r["dtype"] else 1e-4), r
    graphs = [r for r in report if r.get("graph")]
    assert len(graphs) == 5 and all(r["vs_nccl"] == 0.0 for r in graphs)
