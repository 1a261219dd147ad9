"""A read-only streaming kernel: every element loaded once, one float kept per
program (so the loads cannot be dropped), for the decode floor's bandwidth."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (elements per load, loads per program, warps): tried in turn, the best kept.
CONFIGS = ((4096, 16, 4), (8192, 8, 8), (16384, 4, 16))


@triton.jit
def _read_kernel(src_ptr, partial_ptr, n, BLOCK: tl.constexpr, LOADS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * LOADS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(LOADS):
        offsets = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


def partial_sums(src: torch.Tensor, config: tuple[int, int, int]) -> torch.Tensor:
    """The per-program output buffer ``read_all`` writes for ``config``."""
    block, loads, _ = config
    return torch.empty(triton.cdiv(src.numel(), block * loads), dtype=torch.float32,
                       device=src.device)


def read_all(src: torch.Tensor, partial: torch.Tensor, config: tuple[int, int, int]) -> None:
    """Load every element of the contiguous ``src``; partial[i] = program i's sum."""
    block, loads, warps = config
    _read_kernel[(partial.numel(),)](src, partial, src.numel(), BLOCK=block, LOADS=loads,
                                     num_warps=warps)
