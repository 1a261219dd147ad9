"""``apply_grammar_bitmask`` of runner/structured_outputs.py in Triton, with
the torch reference's signature."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _grammar_mask_kernel(
    logits_ptr,
    logits_stride,
    bitmask_ptr,
    bitmask_stride,
    logits_rows_ptr,
    num_logits_rows,
    vocab_size,
    BLOCK: tl.constexpr,
):
    # Program (r, b): tokens [b * BLOCK, (b + 1) * BLOCK) of mask row r.
    r = tl.program_id(0)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(logits_rows_ptr + r).to(tl.int64)
    # A row outside the step's logits touches no token.
    limit = tl.where((row >= 0) & (row < num_logits_rows), vocab_size, 0)
    in_vocab = tokens < limit
    words = tl.load(bitmask_ptr + r * bitmask_stride + tokens // 32, mask=in_vocab, other=-1)
    forbidden = ((words >> (tokens % 32)) & 1) == 0
    minus_inf = tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * logits_stride + tokens, minus_inf, mask=in_vocab & forbidden)


def apply_grammar_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                                 logits_rows: torch.Tensor) -> None:
    """``apply_grammar_bitmask_ref``: one program per (mask row, block of tokens)."""
    num_rows = bitmask.shape[0]
    if num_rows == 0:
        return
    block = 1024
    grid = (num_rows, triton.cdiv(logits.shape[1], block))
    _grammar_mask_kernel[grid](
        logits, logits.stride(0), bitmask, bitmask.stride(0), logits_rows,
        logits.shape[0], logits.shape[1], BLOCK=block,
    )
