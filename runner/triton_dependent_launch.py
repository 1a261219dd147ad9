"""Programmatic dependent launch (PDL) of the decode step's Triton kernels.

Between two kernels on a stream the GPU normally drains the first, then
launches the second: a microsecond or two per boundary, hundreds of times in
a decode step. Launched with PDL, a kernel's programs may start as soon as
every program of the kernel before it has signalled (``gdc_launch_dependents``),
and they wait (``gdc_wait``) for that kernel's completion and the
visibility of its writes before they read or write anything. CUDA graphs
keep the dependency when they capture such launches.

Invariant of a kernel launched with PDL: every program waits first, before
any load, store or early return (``wait_for_previous_kernel``). So a
kernel cannot complete before the one before it, completion stays
transitive along the stream, and kernels launched without PDL (cuBLAS,
torch) are ordered as before.

Only devices of compute capability 9.0 and up have the instructions
(``runner.ops.launch_pdl`` says where kernels use them); the interpreter
(CPU tests) launches without.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With PDL: wait until the kernel before this one has completed and its
    writes are visible, then let the next kernel's programs start. Nothing
    without (PDL false: a plain launch, or the interpreter)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
