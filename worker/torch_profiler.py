"""One worker's torch profiler, between ``start_profile`` and ``stop_profile``.

Each start makes a fresh ``torch.profiler.profile`` recording this process's
CPU operators and, where the device has them, its CUDA kernels
(``DeviceOps.profiler_activities``); the worker's busy loop runs its steps
meanwhile, so the trace holds every step the worker ran in between. Stop
ends the recording and writes, before it returns (the stop's reply waits
for the file):

- ``DIR/TRACE_NAME.TIME_NS.pt.trace.json.gz`` (``.json`` without gzip), a
  Chrome trace as ``torch.profiler.tensorboard_trace_handler`` names its
  files (Perfetto and chrome://tracing open it); ``TRACE_NAME`` is vLLM's
  rank suffix, ``dp{D}_pp0_tp{T}_dcp0_ep0_rank{R}`` (after
  ``PREFIX_`` when the start names a prefix), so every rank of every
  data-parallel replica writes its own file;
- with ``torch_profiler_dump_cuda_time_total``, ``DIR/profiler_out_{R}.txt``:
  the operators' totals, sorted by their self CUDA time (self CPU time on a
  device without CUDA activity), as vLLM writes it.

A start while recording and a stop while not are ignored (logged), as in
vLLM; the directory is made at start, so a path that cannot be written
fails the start, not the stop.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from ipc.config import ProfilerConfig

logger = logging.getLogger(__name__)

_ACTIVITIES = {"CPU": torch.profiler.ProfilerActivity.CPU,
               "CUDA": torch.profiler.ProfilerActivity.CUDA}


def trace_name(tp_rank: int, world_size: int, data_parallel_rank: int,
               prefix: str | None = None) -> str:
    """vLLM's name of a worker's trace: its place in each parallel dimension
    (tprun has data and tensor parallelism; the others are 0) and its global
    rank, after ``prefix`` when one is given."""
    global_rank = data_parallel_rank * world_size + tp_rank
    name = f"dp{data_parallel_rank}_pp0_tp{tp_rank}_dcp0_ep0_rank{global_rank}"
    return f"{prefix}_{name}" if prefix else name


class TorchProfiler:
    def __init__(self, config: ProfilerConfig, activities: tuple[str, ...]):
        self.config = config
        self.activities = activities
        self.profile: torch.profiler.profile | None = None  # recording when set
        self.name = ""
        self.global_rank = 0

    @property
    def recording(self) -> bool:
        return self.profile is not None

    def start(self, name: str, global_rank: int) -> None:
        if self.profile is not None:
            logger.info("start_profile while the profiler records: ignored")
            return
        os.makedirs(self.config.torch_profiler_dir, exist_ok=True)
        c = self.config
        profile = torch.profiler.profile(
            activities=[_ACTIVITIES[a] for a in self.activities],
            record_shapes=c.torch_profiler_record_shapes,
            profile_memory=c.torch_profiler_with_memory,
            with_stack=c.torch_profiler_with_stack, with_flops=c.torch_profiler_with_flops)
        profile.start()
        self.profile, self.name, self.global_rank = profile, name, global_rank

    def stop(self) -> list[str]:
        """The files written (none when not recording)."""
        profile, self.profile = self.profile, None
        if profile is None:
            logger.warning("Profiler was not started, nothing to stop.")
            return []
        profile.stop()
        directory = self.config.torch_profiler_dir
        path = os.path.join(directory, f"{self.name}.{time.time_ns()}.pt.trace.json")
        if self.config.torch_profiler_use_gzip:
            path += ".gz"
        profile.export_chrome_trace(path)
        written = [path]
        if self.config.torch_profiler_dump_cuda_time_total:
            sort_by = ("self_cuda_time_total" if "CUDA" in self.activities
                       else "self_cpu_time_total")
            table = os.path.join(directory, f"profiler_out_{self.global_rank}.txt")
            with open(table, "w") as f:
                print(profile.key_averages().table(sort_by=sort_by), file=f)
            written.append(table)
        logger.info("profiler trace written: %s", ", ".join(written))
        return written
