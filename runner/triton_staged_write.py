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


@triton.jit
def _grouped_writes_kernel(header_ptr, words_ptr, num_targets, num_writes,
                           BLOCK: tl.constexpr):
    """One program per write: its words to its target's row, through the
    target's address (layout in runner/staged_write_group.py)."""
    write = tl.program_id(0)
    meta = header_ptr + 4 * num_targets + 1
    target = tl.load(meta + write)
    row = tl.load(meta + num_writes + write)
    start = tl.load(meta + 2 * num_writes + write)
    first = tl.load(meta + 3 * num_writes + write)
    count = tl.load(meta + 3 * num_writes + write + 1) - first
    base = tl.load(header_ptr + target)
    row_bytes = tl.load(header_ptr + num_targets + target)
    elem_bytes = tl.load(header_ptr + 2 * num_targets + target)
    dst = (base + row * row_bytes + start * elem_bytes).to(tl.pointer_type(tl.int32))
    for off in range(0, count, BLOCK):
        k = off + tl.arange(0, BLOCK)
        mask = k < count
        tl.store(dst + k, tl.load(words_ptr + first + k, mask=mask), mask=mask)


def apply_grouped_writes_triton(dsts: list[torch.Tensor], header: torch.Tensor,
                                words: torch.Tensor) -> None:
    """``apply_grouped_writes_ref`` (runner/staged_write_group.py): one program
    per write, all targets in one launch."""
    num_targets = len(dsts)
    num_writes = (header.shape[0] - 4 * num_targets - 2) // 4
    if num_writes <= 0:
        return
    _grouped_writes_kernel[(num_writes,)](header, words, num_targets, num_writes, BLOCK=1024)
