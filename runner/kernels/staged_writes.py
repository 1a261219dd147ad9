"""Apply a batch of packed row writes to a 2-D tensor in one launch.

Write j puts values[cu_lens[j] : cu_lens[j+1]] into dst[rows[j], starts[j] : ...].
The writes must not overlap (runner.staged_write.pack_writes resolves
overlaps on the host, so the order in which programs run does not matter).
rows, starts and cu_lens are int64; values has dst's dtype; dst is 2-D with
contiguous rows (a 1-D tensor is passed as a [n, 1] view).
"""

from __future__ import annotations

import torch

from runner.kernels.dispatch import on_cuda
from runner.triton_import import tl, triton


def _check(dst: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, cu_lens: torch.Tensor):
    if dst.dim() != 2 or dst.stride(1) != 1:
        raise ValueError(f"dst must be 2-D with contiguous rows, got shape {tuple(dst.shape)}")
    if rows.shape[0] != starts.shape[0] or cu_lens.shape[0] != rows.shape[0] + 1:
        raise ValueError("rows, starts need n entries and cu_lens n + 1")


def apply_staged_writes_ref(
    dst: torch.Tensor,
    rows: torch.Tensor,
    starts: torch.Tensor,
    cu_lens: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """Torch reference: one scatter over all written elements, no sync."""
    _check(dst, rows, starts, cu_lens)
    num_values = values.shape[0]
    if rows.shape[0] == 0 or num_values == 0:
        return
    j = torch.arange(num_values, device=dst.device, dtype=torch.int64)
    write = torch.searchsorted(cu_lens[1:], j, right=True)
    cols = starts[write] + (j - cu_lens[write])
    dst[rows[write], cols] = values


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


def apply_staged_writes_triton(
    dst: torch.Tensor,
    rows: torch.Tensor,
    starts: torch.Tensor,
    cu_lens: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """Triton version: one program per write, all in one launch."""
    _check(dst, rows, starts, cu_lens)
    if rows.shape[0] == 0:
        return
    _staged_writes_kernel[(rows.shape[0],)](
        dst, dst.stride(0), rows, starts, cu_lens, values, BLOCK=1024
    )


def apply_staged_writes(
    dst: torch.Tensor,
    rows: torch.Tensor,
    starts: torch.Tensor,
    cu_lens: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """Apply packed writes to dst (Triton on CUDA, torch elsewhere)."""
    impl = apply_staged_writes_triton if on_cuda(dst) else apply_staged_writes_ref
    impl(dst, rows, starts, cu_lens, values)
