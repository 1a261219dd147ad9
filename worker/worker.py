"""One TP rank's worker: a device, a process group and a runner.

The same object serves the daemon (``worker.daemon``) and the in-process
``UniprocExecutor``. Control methods are the only names a ``ControlCall``
may invoke; anything else is refused.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os

import torch
import torch.distributed as dist

from ipc.config import RunnerConfig
from ipc.messages import GrammarBitmask, SchedulerOutput
from runner.distributed import TensorParallelGroup
from runner.model_runner import ModelRunner
from runner.ops import device_ops
from worker.env import TorchrunEnv, disable_multicast
from worker.torch_profiler import TorchProfiler, trace_name

logger = logging.getLogger(__name__)

CONTROL_METHODS = ("load_model", "determine_num_blocks", "init_kv_cache", "health",
                   "start_profile", "stop_profile", "sleep", "wake_up", "memory_bytes")


def pick_device(kind: str, local_rank: int, local_world_size: int = 1) -> torch.device:
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' asked for, but CUDA is not available")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local_rank} needs CUDA device {local_rank}; this "
                               f"machine has {torch.cuda.device_count()}")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    # One share of the cores per local rank, less one core for the engine and
    # the socket threads: oversubscribed ranks spin in OpenMP barriers.
    if "OMP_NUM_THREADS" not in os.environ:
        share = (os.cpu_count() or 1) // max(1, local_world_size) - 1
        torch.set_num_threads(max(1, share))
    return torch.device("cpu")


def init_process_group(env: TorchrunEnv, device: torch.device) -> None:
    """The device's backend (NCCL on GPU, gloo on CPU: ``runner.ops``);
    nothing at world size 1."""
    if env.world_size == 1 or dist.is_initialized():
        return
    backend = device_ops(device).dist_backend
    dist.init_process_group(
        backend=backend,
        # env:// reads MASTER_ADDR/PORT (and joins torchrun's own store when
        # torchrun started this process).
        init_method="env://",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=600),
        device_id=device if backend == "nccl" else None,
    )


def destroy_process_group() -> None:
    """Leave the process group: a barrier, then this rank destroys its group.

    The barrier keeps a rank from tearing its group down while a peer may
    still be inside a collective with it. The store the group met through
    belongs to the executor (or torchrun's agent) and outlives every rank's
    group, so no rank's watchdog finds it gone (executor/rendezvous.py).
    """
    if not dist.is_initialized():
        return
    try:
        dist.barrier()
    except Exception as e:  # a peer already gone: nothing left to wait for
        logger.warning("barrier before leaving the process group failed: %s", e)
    dist.destroy_process_group()


def release_device_memory(device: torch.device) -> None:
    """Collect unreachable objects (reference cycles hold tensors too), then
    hand the caching allocator's free blocks back to the device."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class NoModel:
    """The worker's runner until ``load_model``: every step or cache call is
    refused with the reason, so ``Worker.runner`` is always a usable object."""

    def _refuse(self, *args, **kwargs):
        raise RuntimeError("the model is not loaded (call load_model first)")

    determine_num_blocks = init_kv_cache = execute_model = sample_tokens = _refuse
    sleep = wake_up = memory_bytes = _refuse


class Worker:
    def __init__(self, env: TorchrunEnv, device_kind: str):
        disable_multicast()  # before NCCL or symmetric memory read them
        self.env = env
        self.device = pick_device(device_kind, env.local_rank, env.local_world_size)
        init_process_group(env, self.device)
        self.tp = TensorParallelGroup.from_default_group()
        self.runner: ModelRunner | NoModel = NoModel()
        self.profiler: TorchProfiler | None = None  # profiling on: set by load_model

    @property
    def is_output_rank(self) -> bool:
        return self.env.rank == 0

    def call(self, method: str, kwargs: dict):
        if method not in CONTROL_METHODS:
            raise ValueError(f"unknown control method {method!r}")
        return getattr(self, method)(**kwargs)

    def load_model(self, config: RunnerConfig) -> dict:
        """Build the runner from the engine's ``RunnerConfig`` (checked by
        ``EngineConfig``; it arrives typed, decoded by the broadcast channel)."""
        if not isinstance(config, RunnerConfig):
            raise TypeError(f"load_model needs a RunnerConfig, got {type(config).__name__}")
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(config, self.device, self.tp)
        if config.profiler is not None:
            self.profiler = TorchProfiler(config.profiler,
                                          device_ops(self.device).profiler_activities)
        return {"bytes_per_block": self.runner.bytes_per_block()}

    def determine_num_blocks(self) -> int:
        """Blocks that fit this rank's budget (the executor takes the minimum)."""
        return self.runner.determine_num_blocks()

    def init_kv_cache(self, num_blocks: int) -> None:
        self.runner.init_kv_cache(num_blocks)

    def sleep(self, level: int) -> dict[str, int]:
        """Sleep mode (``runner.sleep_mode``): free the runner's weights and
        KV cache, then hand the freed memory back to the device; returns
        the bytes they hold after (``memory_bytes``)."""
        self.runner.sleep(level)
        release_device_memory(self.device)
        return self.runner.memory_bytes()

    def wake_up(self, tags: list[str] | None) -> dict[str, int]:
        """Restore what ``sleep`` freed, the parts ``tags`` name (None: all)."""
        self.runner.wake_up(tags)
        return self.runner.memory_bytes()

    def memory_bytes(self) -> dict[str, int]:
        """Device bytes of the runner's weights and KV cache now."""
        return self.runner.memory_bytes()

    def health(self) -> dict:
        return {"rank": self.env.rank, "device": str(self.device)}

    def start_profile(self, profile_prefix: str | None = None,
                      data_parallel_rank: int = 0) -> None:
        """Start this rank's torch profiler (``worker.torch_profiler``); the
        steps this worker runs until ``stop_profile`` are in its trace."""
        if self.profiler is None:
            raise RuntimeError("profiling is off: the engine has no profiler_config")
        env = self.env
        self.profiler.start(trace_name(env.rank, env.world_size, data_parallel_rank,
                                       profile_prefix),
                            data_parallel_rank * env.world_size + env.rank)

    def stop_profile(self) -> list[str]:
        """Stop the profiler and write its trace; the files written."""
        if self.profiler is None:
            raise RuntimeError("profiling is off: the engine has no profiler_config")
        return self.profiler.stop()

    def execute_model(self, plan: SchedulerOutput) -> None:
        """Apply the plan and queue the step's forward pass."""
        self.runner.execute_model(plan)

    def sample_tokens(self, grammar: GrammarBitmask | None):
        """Sample the step (masked by ``grammar`` when its plan has
        constrained requests); returns the AsyncOutput (the caller decides
        who waits)."""
        return self.runner.sample_tokens(grammar)

    def shutdown(self) -> None:
        """Free this rank's memory, then leave the process group.

        The runner owns every tensor of the rank (weights, KV cache, CUDA
        graphs and their pool, staged and pinned buffers, sampler state):
        once it is dropped and collected, the device memory is free even when
        the process lives on (the in-process executor). The runner goes
        first: its peer buffers (symmetric memory) were exchanged through the
        process group and are released while the group still exists.
        A trace still recording is written first (vLLM's). Idempotent.
        """
        if self.profiler is not None and self.profiler.recording:
            try:
                self.profiler.stop()
            except Exception as e:  # leaving the group matters more than the trace
                logger.warning("the profiler's trace was not written at shutdown: %s", e)
        self.runner = None
        try:
            release_device_memory(self.device)
        finally:  # a device in an error state still leaves the group
            destroy_process_group()
