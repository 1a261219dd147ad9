"""The noise draw and the greedy argmax of ``noise.py`` in Triton: one
program per (row, vocab block) reads its row's temperature and seed at the
row's slot, masks the logits below the row's filter threshold, divides,
hashes, adds the Gumbel noise and reduces the argmax in registers,
bit-identical in the hash to the torch reference. The
last block program of a row to finish (its ticket, ``runner/ticket_counters.py``)
reduces the row's block maxima to the token, so a draw is one launch: the
sampler runs after every step, where each launch is a kernel boundary. It
launches with programmatic dependent launch where the device has it
(``runner/triton_dependent_launch.py``).

NaN counts as +inf, where torch counts it above every number: the two
differ only on a row holding both, and neither gives an index past the
vocabulary (a NaN left as it is would, see ``_block_argmax_kernel``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.ops import pdl_launch
from runner.ticket_counters import TicketCounters, take_ticket
from runner.triton_dependent_launch import wait_for_previous_kernel

# The draws' counters, one a row: draws run one after another on the
# runner's stream and each leaves its counters at 0.
COUNTERS = TicketCounters()


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
    temperature_ptr,
    temperature_stride,
    seeds_ptr,
    positions_ptr,
    threshold_ptr,
    block_max_ptr,
    block_arg_ptr,
    counters_ptr,
    out_ptr,
    slots_ptr,
    last_tokens_ptr,
    num_blocks,
    vocab_size,
    BLOCK: tl.constexpr,
    BLOCKS_PAD: tl.constexpr,
    GUMBEL: tl.constexpr,
    FILTERED: tl.constexpr,
    RECORD: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per (row, vocab block): the max of logits and the first token that
    reaches it; the row's last block to finish writes the token of the
    first block holding the row's max to ``out_ptr`` and, with RECORD, to
    ``last_tokens_ptr[slots_ptr[row]]``. With GUMBEL, a row whose slot's
    temperature is not 0 divides its logits by it (rounded as torch
    divides) and adds the Gumbel noise of (its slot's seed, its position,
    token id); with FILTERED, logits below the row's threshold first
    become -inf (``filters.filter_thresholds_ref``)."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    block = tl.program_id(1)
    tokens = block * BLOCK + tl.arange(0, BLOCK)
    inside = tokens < vocab_size
    score = tl.load(logits_ptr + row * logits_stride + tokens, mask=inside,
                    other=float("-inf")).to(tl.float32)
    if GUMBEL:
        slot = tl.load(slots_ptr + row)
        temperature = tl.load(temperature_ptr + slot * temperature_stride)
        if temperature != 0.0:
            if FILTERED:
                score = tl.where(score < tl.load(threshold_ptr + row), float("-inf"), score)
            # -inf stays -inf, also at an infinite temperature (-inf / inf
            # would be NaN, which the argmax takes as the largest).
            masked = score == float("-inf")
            scaled = tl.div_rn(tl.where(masked, 0.0, score), tl.zeros_like(score) + temperature)
            score = tl.where(masked, score, scaled)
            seed = tl.load(seeds_ptr + slot).to(tl.uint64, bitcast=True)
            position = tl.load(positions_ptr + row).to(tl.uint64)
            key = _mix(_mix(seed) + position * 0x9E3779B97F4A7C15)
            token_key = _mix((tokens.to(tl.uint64) + 1) * 0xD1B54A32D192ED03)
            bits = _mix(key ^ token_key)
            u = ((bits >> 41).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23
            score = tl.where(inside, score + -tl.log(-tl.log(u)), float("-inf"))
    # NaN as +inf: the reductions' comparisons never pick a NaN, so a row of
    # NaNs would reduce to a padding lane (an index past the vocabulary).
    score = tl.where(score != score, float("inf"), score)
    best, arg = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(block_max_ptr + row * num_blocks + block, best)
    tl.store(block_arg_ptr + row * num_blocks + block, block * BLOCK + arg)
    if take_ticket(counters_ptr + row, num_blocks):
        blocks = tl.arange(0, BLOCKS_PAD)
        maxima = tl.load(block_max_ptr + row * num_blocks + blocks, mask=blocks < num_blocks,
                         other=float("-inf"))
        _, first = tl.max(maxima, axis=0, return_indices=True,
                          return_indices_tie_break_left=True)
        token = tl.load(block_arg_ptr + row * num_blocks + first)
        tl.store(out_ptr + row, token)
        if RECORD:
            slot = tl.load(slots_ptr + row)
            tl.store(last_tokens_ptr + slot, token.to(last_tokens_ptr.dtype.element_ty))


def _block_argmax(logits: torch.Tensor, block: int, slots: torch.Tensor | None = None,
                  last_tokens: torch.Tensor | None = None,
                  noise: tuple[torch.Tensor, ...] | None = None,
                  threshold: torch.Tensor | None = None) -> torch.Tensor:
    """Argmax per row in one launch: one program per (row, vocab block), the
    row's last to finish reducing the blocks' maxima (the first block wins a
    tie, so the first token does overall, as with ``torch.argmax``). With
    ``last_tokens``, row i's token is also stored at ``last_tokens[slots[i]]``.
    ``noise``: (temperature, seeds, positions), the per-slot tables and
    per-row positions of ``gumbel_argmax_ref``, with its ``threshold``."""
    logits = logits.contiguous()
    n, vocab_size = logits.shape
    num_blocks = triton.cdiv(vocab_size, block)
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    block_max = torch.empty(n, num_blocks, dtype=torch.float32, device=logits.device)
    block_arg = torch.empty(n, num_blocks, dtype=torch.int64, device=logits.device)
    # Pointers a launch never reads get ``out`` in their place.
    temperature, seeds, positions = noise or (out, out, out)
    _block_argmax_kernel[(n, num_blocks)](
        logits, logits.stride(0), temperature, temperature.stride(0), seeds, positions,
        out if threshold is None else threshold,
        block_max, block_arg,
        COUNTERS.at_least(n, logits.device), out, out if slots is None else slots,
        out if last_tokens is None else last_tokens, num_blocks, vocab_size, BLOCK=block,
        BLOCKS_PAD=triton.next_power_of_2(num_blocks), GUMBEL=noise is not None,
        FILTERED=threshold is not None, RECORD=last_tokens is not None,
        **pdl_launch(logits.device),
    )  # fmt: skip
    return out


def gumbel_argmax_triton(
    logits: torch.Tensor, slots: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
    positions: torch.Tensor, tokens: torch.Tensor, threshold: torch.Tensor | None = None,
    last_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``gumbel_argmax_ref`` in one launch: each row reads its slot's
    temperature and seed, filters, scales, hashes and adds the noise in
    registers, and stores its token at its slot. ``tokens`` (the
    reference's table of the tokens' keys) is not read: the kernel hashes
    the token ids itself, as the table was made."""
    del tokens
    return _block_argmax(logits, 1024, slots, last_tokens, (temperature, seeds, positions),
                         threshold)


def greedy_argmax_triton(logits: torch.Tensor, slots: torch.Tensor | None = None,
                         last_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """``greedy_argmax_ref`` in blocks of 2048 tokens: torch reduces a row in
    one thread block, which leaves the rest of the device idle; the tokens
    reach ``last_tokens`` in the same launch."""
    return _block_argmax(logits, 2048, slots, last_tokens)
