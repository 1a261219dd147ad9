"""The noise draw and the greedy argmax of ``noise.py`` in Triton: one
program per (row, vocab block) hashes, adds the Gumbel noise and reduces the
argmax in registers, bit-identical in the hash to the torch reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.sampling.noise import row_keys


@triton.jit
def _mix(x):
    """splitmix64 finaliser on uint64 (logical shifts, wrapping products)."""
    x = x ^ (x >> 30)
    x = x * 0xBF58476D1CE4E5B9
    x = x ^ (x >> 27)
    x = x * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _block_argmax_kernel(
    logits_ptr,
    logits_stride,
    row_keys_ptr,
    block_max_ptr,
    block_arg_ptr,
    num_blocks,
    vocab_size,
    BLOCK: tl.constexpr,
    GUMBEL: tl.constexpr,
):
    """Per (row, vocab block): the max of logits (+ Gumbel noise with GUMBEL)
    and the first token that reaches it."""
    row = tl.program_id(0)
    block = tl.program_id(1)
    tokens = block * BLOCK + tl.arange(0, BLOCK)
    inside = tokens < vocab_size
    score = tl.load(logits_ptr + row * logits_stride + tokens, mask=inside,
                    other=float("-inf")).to(tl.float32)
    if GUMBEL:
        key = tl.load(row_keys_ptr + row).to(tl.uint64, bitcast=True)
        token_key = _mix((tokens.to(tl.uint64) + 1) * 0xD1B54A32D192ED03)
        bits = _mix(key ^ token_key)
        u = ((bits >> 41).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23
        score = tl.where(inside, score + -tl.log(-tl.log(u)), float("-inf"))
    best, arg = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(block_max_ptr + row * num_blocks + block, best)
    tl.store(block_arg_ptr + row * num_blocks + block, block * BLOCK + arg)


def _block_argmax(logits: torch.Tensor, keys: torch.Tensor | None, block: int) -> torch.Tensor:
    """Argmax per row in two stages: one program per (row, vocab block), then
    torch's argmax over the blocks' maxima (the first block wins a tie, so the
    first token does overall, as with ``torch.argmax``)."""
    logits = logits.contiguous()
    n, vocab_size = logits.shape
    num_blocks = triton.cdiv(vocab_size, block)
    block_max = torch.empty(n, num_blocks, dtype=torch.float32, device=logits.device)
    block_arg = torch.empty(n, num_blocks, dtype=torch.int64, device=logits.device)
    if n > 0:
        _block_argmax_kernel[(n, num_blocks)](
            # Without noise the keys pointer is never read; logits stands in for it.
            logits, logits.stride(0), logits if keys is None else keys, block_max, block_arg,
            num_blocks, vocab_size, BLOCK=block, GUMBEL=keys is not None,
        )  # fmt: skip
    best_block = block_max.argmax(dim=-1, keepdim=True)
    return block_arg.gather(1, best_block)[:, 0]


def gumbel_argmax_triton(
    logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """``gumbel_argmax_ref`` in Triton: hash, add the noise and reduce per vocab block in registers.
    (``tokens`` is unused: the kernel hashes token ids itself.)"""
    return _block_argmax(logits, row_keys(seeds, positions), block=1024)


def greedy_argmax_triton(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` in blocks of 2048 tokens: torch reduces a row
    in one thread block, which leaves the rest of the device idle."""
    return _block_argmax(logits, None, block=2048)
