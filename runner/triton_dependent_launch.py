"""Programmatic dependent launch (PDL) of the decode step's Triton kernels.

Between two kernels on a stream the GPU normally drains the first, then
launches the second: a microsecond or two per boundary, hundreds of times in
a decode step. Launched with PDL, a kernel's programs may start as soon as
every program of the kernel before it has signalled (``gdc_launch_dependents``),
and they wait (``gdc_wait``) for that kernel's completion and the
visibility of its writes before they read or write anything. CUDA graphs
keep the dependency when they capture such launches.

Invariant of a kernel launched with PDL: every program waits first, before
any store, early return or load of memory a kernel may write
(``wait_for_previous_kernel``); only loads of constant data, the model's
weights, may come before it (``triton_gemv.py`` loads its first weight
tile there). So a kernel cannot complete before the one before it,
completion stays transitive along the stream, and kernels launched
without PDL (cuBLAS, torch) are ordered as before.

When the next kernel may start is each kernel's choice, not a matter of
correctness (its programs wait in any case). Most let it start at once
(``wait_for_previous_kernel``), which hides its launch behind this one's
run. The matmuls that carry the decoder's norms (``runner/layers/norm_in_matmul.py``)
let it start only once their K loop has issued its loads
(``wait_for_previous_kernel(PDL, False)``, then ``let_next_kernel_start``),
or, where they split K, only at their exit: there one weight-streaming
matmul follows another with no small kernel between, and a successor
launched early puts its programs onto whichever SMs have room while the
predecessor still runs, unevenly; launched once the predecessor's loads are
issued, it spreads over the SMs as they free up. A launch split over K
still has its column groups' last programs to run after the loop (their
tickets, the sum of the splits, the epilogue), so its successor waits for
them off the SMs.

Only devices of compute capability 9.0 and up have the instructions
(``runner.ops.launch_pdl`` says where kernels use them); the interpreter
(CPU tests) launches without.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr, LET_NEXT_START: tl.constexpr = True):
    """With PDL: wait until the kernel before this one has completed and its
    writes are visible, then, with LET_NEXT_START, let the next kernel's
    programs start (without, the kernel calls ``let_next_kernel_start``
    later, or the next kernel starts when this one completes). Nothing
    without PDL (a plain launch, or the interpreter)."""
    if PDL:
        gdc_wait()
        if LET_NEXT_START:
            gdc_launch_dependents()


@triton.jit
def let_next_kernel_start(PDL: tl.constexpr):
    """With PDL: let the next kernel's programs start (they still wait for
    this kernel's completion before they touch memory). Nothing without."""
    if PDL:
        gdc_launch_dependents()
