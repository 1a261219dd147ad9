"""``apply_grouped_writes_ref`` (runner/staged_write_group.py) in Triton: one
program per packed write, the writes to every target in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# One compiled version serves every step: the counts vary from step to step
# (1 or a multiple of 16 would otherwise each compile a version of their own,
# in the middle of serving), and the offset is always a multiple of 16.
@triton.jit(do_not_specialize=["words_offset", "num_targets", "num_writes"])
def _grouped_writes_kernel(blob_ptr, words_offset, num_targets, num_writes,
                           BLOCK: tl.constexpr):
    """One program per write: its words to its target's row, through the
    target's address (layout in runner/staged_write_group.py): the header
    at the start of ``blob``, the words from byte ``words_offset`` on."""
    write = tl.program_id(0)
    header_ptr = blob_ptr.to(tl.pointer_type(tl.int64))
    words_ptr = (blob_ptr + words_offset).to(tl.pointer_type(tl.int32))
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


def apply_grouped_writes_triton(dsts: list[torch.Tensor], blob: torch.Tensor, words_offset: int,
                                num_writes: int) -> None:
    """``apply_grouped_writes_ref`` (runner/staged_write_group.py): one program
    per write, all targets in one launch, reading the uploaded buffer as it
    is (no views of it to make on the host)."""
    if num_writes <= 0:
        return
    _grouped_writes_kernel[(num_writes,)](blob, words_offset, len(dsts), num_writes, BLOCK=1024)
