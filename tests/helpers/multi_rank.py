"""Run one function on N ranks of a process group; collect each rank's tensors.

    results = run_on_ranks(fn, world_size=2, kwargs={"model_dir": path})
    assert_ranks_bitwise_equal(results)

``fn`` is a module-level function ``fn(rank: RankInfo, **kwargs) -> dict[str,
Tensor]``; ``kwargs`` must be JSON (they cross a process boundary as text).
Each rank is a fresh ``python -m tests.helpers.multi_rank`` process with torchrun's
environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
NVLink multicast off; at world size > 1 it joins a process group (NCCL, one
GPU per rank, when CUDA has enough devices; gloo on the CPU otherwise) before
it calls ``fn``, and leaves it after. Results come back as safetensors files:
no pickle crosses a process boundary. A rank that fails, or a run longer than
``timeout_s``, raises with every rank's stderr.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tests.helpers.proc_utils import ROOT


@dataclass(frozen=True)
class RankInfo:
    """What a rank's function is told: its rank, the world, its device and
    the tensor-parallel group the model's layers talk through."""

    rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None at world size 1: no process group

    @property
    def tp(self):
        from runner.distributed import TensorParallelGroup

        return TensorParallelGroup.from_default_group()


def tp_device(world_size: int) -> str:
    """The device ``world_size`` ranks of one host can run on: "cuda" when
    CUDA has a device per rank, "cpu" otherwise (the engine refuses CUDA
    with fewer devices than ranks)."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "cuda"
    return "cpu"


def default_backend(world_size: int) -> str:
    """NCCL where the ranks run on CUDA (``tp_device``), gloo otherwise."""
    return "nccl" if tp_device(world_size) == "cuda" else "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_on_ranks(fn, world_size: int, kwargs: dict | None = None, backend: str | None = None,
                 timeout_s: float = 120.0) -> list[dict[str, torch.Tensor]]:
    """Run ``fn`` on ``world_size`` ranks; returns each rank's tensors (on the
    CPU), in rank order. ``backend``: "nccl" or "gloo" (default: see
    ``default_backend``)."""
    target = f"{fn.__module__}:{fn.__qualname__}"
    backend = backend or default_backend(world_size)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="tprun-ranks-") as out:
        procs = [_spawn(rank, world_size, backend, port, target, kwargs or {}, out)
                 for rank in range(world_size)]
        codes = _wait_all(procs, timeout_s)
        errors = [_stderr_tail(p) for p in procs]
        if any(code != 0 for code in codes):
            report = "\n".join(f"--- rank {r} (exit {c}):\n{e}"
                               for r, (c, e) in enumerate(zip(codes, errors)))
            raise RuntimeError(f"{target} failed on {world_size} ranks:\n{report}")
        from safetensors.torch import load_file

        return [load_file(os.path.join(out, f"rank{r}.safetensors")) for r in range(world_size)]


def _spawn(rank: int, world_size: int, backend: str, port: int, target: str, kwargs: dict,
           out: str) -> subprocess.Popen:
    from worker.env import disable_multicast

    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    disable_multicast(env)
    cmd = [sys.executable, "-m", "tests.helpers.multi_rank", "--target", target, "--backend", backend,
           "--kwargs", json.dumps(kwargs), "--out", out]
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=err)
    proc.stderr_file = err
    return proc


def _wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[int]:
    """Exit codes; every rank is killed once one fails or time runs out (a
    failed rank leaves its peers waiting in a collective)."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs):
        failed = any(p.poll() not in (None, 0) for p in procs)
        if failed or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            break
        time.sleep(0.05)
    return [p.returncode for p in procs]


def _stderr_tail(proc: subprocess.Popen, limit: int = 4000) -> str:
    proc.stderr_file.seek(0)
    text = proc.stderr_file.read()
    proc.stderr_file.close()
    return text[-limit:]


def assert_ranks_bitwise_equal(results: list[dict[str, torch.Tensor]]) -> None:
    """Every rank returned the same names, dtypes, shapes and bits."""
    first = results[0]
    for rank, other in enumerate(results[1:], start=1):
        if set(other) != set(first):
            raise AssertionError(f"rank {rank} returned {sorted(other)}, rank 0 {sorted(first)}")
        for name, tensor in first.items():
            if not _same_bits(tensor, other[name]):
                raise AssertionError(f"{name!r}: rank {rank} differs from rank 0 in its bits")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():  # NaN == NaN and -0.0 != 0.0, bit for bit
        a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    return torch.equal(a, b)


# ---- inside a rank ------------------------------------------------------
def _rank_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.multi_rank")
    parser.add_argument("--target", required=True, help="module:function")
    parser.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    parser.add_argument("--kwargs", default="{}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    grouped = world_size > 1
    if grouped:
        dist.init_process_group(args.backend, init_method="env://", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=120),
                                device_id=device if device.type == "cuda" else None)
    module_name, name = args.target.split(":")
    fn = importlib.import_module(module_name)
    for part in name.split("."):
        fn = getattr(fn, part)
    info = RankInfo(rank, world_size, device, args.backend if grouped else None)
    tensors = fn(info, **json.loads(args.kwargs))
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
              os.path.join(args.out, f"rank{rank}.safetensors"))
    if grouped and dist.is_initialized():  # ``fn`` may have left the group itself
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main()
