"""Tickets: how the programs of one launch find the last of a group to finish.

A launch whose programs each compute a part of a result (split-KV
attention, split-K projections) needs one program to combine the parts, and
no program may wait for another. Each program stores its part, then takes a
ticket from its group's counter (``take_ticket``): the program that draws
the group size minus one knows every other part is stored, combines them,
and puts the counter back to 0. Programs only count, so any schedule
finishes.

Memory order: a CTA barrier puts all of a program's stores before its ticket
(Triton issues a scalar atomic from one thread); the ticket is an
acquire-release atomic at GPU scope, so it releases this program's parts and
acquires every earlier program's.

Invariant of the counters (``TicketCounters``): zero between launches. They
are zeroed once when allocated, and each launch leaves every counter it used
at 0 again, so neither eager steps nor CUDA-graph replays clear them.
Launches sharing counters must not overlap: they run on one stream, where a
kernel launched with PDL touches nothing before the kernel before it has
completed (``runner/triton_dependent_launch.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


class TicketCounters:
    """Per device, the counters that launches take tickets from.

    ``at_least(n, device)`` returns a zeroed int32 buffer of at least n
    counters, allocated once and grown when a launch needs more. An outgrown
    buffer stays referenced here: a CUDA graph captured with it keeps its
    address. Growing while a graph is captured would record the zeroing in
    the graph (correct, one memset per replay); callers ask on every launch,
    so the eager warm-up before a capture has grown them already.
    """

    def __init__(self) -> None:
        self._current: dict[torch.device, torch.Tensor] = {}
        self._outgrown: list[torch.Tensor] = []

    def at_least(self, n: int, device: torch.device) -> torch.Tensor:
        counters = self._current.get(device)
        if counters is None or counters.numel() < n:
            if counters is not None:
                self._outgrown.append(counters)
            size = max(n, 1024, 2 * (0 if counters is None else counters.numel()))
            counters = torch.zeros(size, dtype=torch.int32, device=device)
            self._current[device] = counters
        return counters


@triton.jit
def take_ticket(counter_ptr, group_size):
    """Count this program's parts as stored; True in the group's last program
    to arrive, which has then reset the counter to 0 and sees every part."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == group_size - 1
    if last:
        tl.store(counter_ptr, 0)
    return last
