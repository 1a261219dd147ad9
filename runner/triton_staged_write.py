"""``apply_staged_writes_ref`` (runner/staged_write.py) in Triton: one program
per packed write, all writes in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _staged_writes_kernel(
    dst_ptr,
    dst_stride,
    rows_ptr,
    starts_ptr,
    cu_lens_ptr,
    values_ptr,
    BLOCK: tl.constexpr,
):
    write = tl.program_id(0)
    row = tl.load(rows_ptr + write)
    start = tl.load(starts_ptr + write)
    first = tl.load(cu_lens_ptr + write)
    count = tl.load(cu_lens_ptr + write + 1) - first
    dst = dst_ptr + row * dst_stride + start
    for off in range(0, count, BLOCK):
        k = off + tl.arange(0, BLOCK)
        mask = k < count
        tl.store(dst + k, tl.load(values_ptr + first + k, mask=mask), mask=mask)


def apply_staged_writes_triton(dst: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor,
                               cu_lens: torch.Tensor, values: torch.Tensor) -> None:
    """One program per write, all in one launch."""
    if rows.shape[0] == 0:
        return
    _staged_writes_kernel[(rows.shape[0],)](
        dst, dst.stride(0), rows, starts, cu_lens, values, BLOCK=1024
    )
