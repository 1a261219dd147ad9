"""Split-K for the skinny kernels: more programs over the same weight read.

A skinny kernel gives each program a few output columns and the whole of K,
so a projection with few outputs (the 1B shape's qkv: 48 programs) keeps
only part of the SMs reading. With split-K each group of columns is read by
SPLIT_K programs, each over its own range of K. Each stores its float32 part
in a workspace and takes a ticket (``runner/ticket_counters.py``); the last
of the group sums the parts, in split order, and runs the kernel's epilogue.
No second launch, no atomics on the data, and the sum's order does not
depend on which program finishes last.

Rounding: the parts are float32 sums over their K ranges; their total is
rounded once, as the one-program kernel rounds its float32 sum, so only the
order of the sum over K differs.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from runner.ticket_counters import TicketCounters

MAX_SPLIT_K = 4
MIN_TILES_PER_SPLIT = 2  # K tiles a split reads at least: fewer leave its pipeline empty

# One set of counters per process: the skinny launches of a step run on one
# stream, one after another, and each leaves its counters at 0.
COUNTERS = TicketCounters()


def choose_split_k(programs: int, k: int, block_k: int, num_sms: int) -> int:
    """Splits of K for a launch of ``programs`` column groups: enough to give
    about every SM a program, at most MAX_SPLIT_K, each split at least
    MIN_TILES_PER_SPLIT tiles of block_k."""
    by_sms = num_sms // max(programs, 1)
    by_k = triton.cdiv(k, block_k) // MIN_TILES_PER_SPLIT
    return max(1, min(MAX_SPLIT_K, by_sms, by_k))


def split_k_range(k: int, block_k: int, split_k: int) -> int:
    """K_PER_SPLIT: the K columns each split reads, a multiple of block_k."""
    return triton.cdiv(triton.cdiv(k, block_k), split_k) * block_k


def split_k_buffers(split_k: int, programs: int, part_floats: int,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(workspace, counters) of a launch: float32 room for every program's
    part (``part_floats`` each), and a zeroed counter per column group. With
    one split the kernel touches neither; they are placeholders then."""
    if split_k == 1:
        return _placeholders(device)
    workspace = torch.empty(programs * split_k * part_floats, dtype=torch.float32, device=device)
    return workspace, COUNTERS.at_least(programs, device)


@functools.cache
def _placeholders(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The empty (workspace, counters) of unsplit launches on ``device``:
    made once, so an eager launch without a split allocates nothing."""
    return (torch.empty(0, dtype=torch.float32, device=device),
            torch.empty(0, dtype=torch.int32, device=device))


@triton.jit
def split_k_bounds(K, K_PER_SPLIT, SPLIT_K: tl.constexpr):
    """(first, end) of the K columns this program reads: its split's range,
    or all of K without a split, where the loop and masks are then exactly a
    one-program kernel's (the bound is K itself, the start the constant 0)."""
    if SPLIT_K == 1:
        return 0, K
    k_lo = tl.program_id(1) * K_PER_SPLIT
    return k_lo, tl.minimum(k_lo + K_PER_SPLIT, K)


@triton.jit
def sum_split_parts(first_ptr, offs, STRIDE: tl.constexpr, SPLIT_K: tl.constexpr):
    """The sum over s, in order, of the parts at first_ptr + s * STRIDE + offs."""
    total = tl.load(first_ptr + offs)
    for s in tl.static_range(1, SPLIT_K):
        total += tl.load(first_ptr + s * STRIDE + offs)
    return total
