"""The LM head of one row with the greedy argmax of its logits in the same launch.

A greedy decode step of one row ends with the LM head (``triton_gemv.gemv``)
and the argmax of its logits (``greedy_argmax_triton``): two launches, and a
kernel boundary between them. With LM_HEAD_ARGMAX each program of the
one-row GEMV, once it has stored its logits (the sampler's other draws and
logprobs read them), also takes its share of the argmax, and the program
that finishes last stores the token: one launch.

Reduction. The GEMV has cdiv(V, LM_HEAD_BLOCK_N) programs (32064 for a
vocabulary of 128256), too many for the last of them to reduce one partial
of each as ``greedy_argmax_triton``'s last program does (it would read
them all alone). Each program instead packs the best of its logits and its
index into one int64 key (``_argmax_keys``) and folds it into one word with
an atomic max; then it takes a ticket (``runner/ticket_counters.py``), and
the last program reads that word, puts it back to 0 and stores the token.

Keys. The logit as stored (rounded to the weight's dtype, so the token is
the argmax of the returned logits), read as float32, with NaN as +inf and
-0 as +0 (as ``greedy_argmax_triton`` counts them), maps its bits to an
unsigned 32-bit code of the same order, which goes above 31 bits of
2**31 - 1 - index: a larger key is a larger logit, or the same logit at a
smaller index, so the first index wins a tie as with ``torch.argmax``.
Every key is above 0, so the word's 0 is below all of them, and a
vocabulary of -inf gives token 0.

The ticket and the best key are the launch's two words of an int64
``TicketCounters`` buffer: 0 between launches, each launch leaves them at 0
again, so CUDA-graph replays need no reset. It launches with programmatic
dependent launch where the device has it, as ``gemv`` does; it touches the
words only after the wait for the previous kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.layers.triton_gemv import (
    GEMV_EARLY,
    LM_HEAD_BLOCK_K,
    LM_HEAD_BLOCK_N,
    check_one_row,
    one_row_products,
)
from runner.layers.triton_skinny_matmul import lm_head_matmul, lm_head_uses_gemv
from runner.ops import pdl_launch
from runner.sampling.triton_noise import greedy_argmax_triton
from runner.ticket_counters import TicketCounters, take_ticket

# The LM head of one row takes its argmax in the same launch (``gemv_argmax``);
# False: the GEMV, then ``greedy_argmax_triton``. bench_decode.py's variant
# "lm-head-argmax" sets it for an A/B (benchmarks/results/README.md).
LM_HEAD_ARGMAX = False

# Per device: word 0 the launch's ticket counter, word 1 its best key.
WORDS = TicketCounters(torch.int64)
INDEX_BITS = 31  # of a key: vocabularies below 2**31


@triton.jit
def _argmax_keys(logits, index):
    """int64 keys, > 0, ordered as (logit, -index): NaN counts as +inf, -0
    as +0."""
    v = logits.to(tl.float32)
    v = tl.where(v != v, float("inf"), v)
    v = tl.where(v == 0.0, 0.0, v)
    bits = v.to(tl.int32, bitcast=True).to(tl.int64)
    # Negative floats: flip the magnitude, so a larger magnitude is smaller;
    # then shift [-2**31, 2**31) to [0, 2**32).
    code = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits) + 0x7FFFFFFF + 1
    return (code << 31) | (0x7FFFFFFF - index.to(tl.int64))


@triton.jit
def _gemv_argmax_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_w, vocab_size, words_ptr,
                        tokens_ptr, slots_ptr, last_tokens_ptr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, EARLY: tl.constexpr, RECORD: tl.constexpr,
                        PDL: tl.constexpr):
    """out[0, n] = x[0] . w[n], rounded once to out's dtype, for this
    program's BLOCK_N outputs; the last program to finish stores the first
    n < vocab_size of the largest out[0, n] at ``tokens_ptr`` and, with
    RECORD, at ``last_tokens_ptr[slots_ptr[0]]``."""
    acc, cols, col_mask = one_row_products(x_ptr, w_ptr, N, K, stride_w, BLOCK_N, BLOCK_K,
                                           EARLY, PDL)
    logits = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + cols, logits, mask=col_mask)
    keys = tl.where(cols < vocab_size, _argmax_keys(logits, cols), 0)
    tl.atomic_max(words_ptr + 1, tl.max(keys, axis=0), sem="relaxed", scope="gpu")
    if take_ticket(words_ptr, tl.num_programs(0)):
        best = tl.atomic_xchg(words_ptr + 1, 0, sem="relaxed", scope="gpu")
        token = 0x7FFFFFFF - (best & 0x7FFFFFFF)
        tl.store(tokens_ptr, token)
        if RECORD:
            slot = tl.load(slots_ptr)
            tl.store(last_tokens_ptr + slot, token.to(last_tokens_ptr.dtype.element_ty))


def gemv_argmax(x: torch.Tensor, w: torch.Tensor, vocab_size: int,
                slots: torch.Tensor | None = None,
                last_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, tokens) in one launch: logits ``gemv(x, w)[:, :vocab_size]``
    (the same values, a view of the [1, N] product) and tokens, int64 [1],
    their ``greedy_argmax_triton`` (with ``last_tokens``, also stored at
    ``last_tokens[slots[0]]``). x [1, K], w [N, K], unit last strides,
    0 < vocab_size <= N < 2**31."""
    n, k = check_one_row("gemv_argmax", x, w)
    if not 0 < vocab_size <= n < 2**INDEX_BITS:
        raise ValueError(f"gemv_argmax takes a vocabulary of 1..{n} rows, got {vocab_size}")
    out = torch.empty(1, n, dtype=w.dtype, device=x.device)
    tokens = torch.empty(1, dtype=torch.int64, device=x.device)
    _gemv_argmax_kernel[(triton.cdiv(n, LM_HEAD_BLOCK_N),)](
        x, w, out, n, k, w.stride(0), vocab_size, WORDS.at_least(2, x.device), tokens,
        tokens if slots is None else slots, tokens if last_tokens is None else last_tokens,
        BLOCK_N=LM_HEAD_BLOCK_N, BLOCK_K=min(LM_HEAD_BLOCK_K, triton.next_power_of_2(k)),
        EARLY=GEMV_EARLY, RECORD=last_tokens is not None, num_warps=4, **pdl_launch(x.device))
    return out[:, :vocab_size], tokens


def lm_head_greedy(x: torch.Tensor, weight: torch.Tensor, vocab_size: int,
                   slots: torch.Tensor | None = None,
                   last_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``lm_head_greedy_ref`` on CUDA: where the LM head takes the one-row
    GEMV (``lm_head_uses_gemv``) and LM_HEAD_ARGMAX is on, ``gemv_argmax``;
    elsewhere ``lm_head_matmul``, then ``greedy_argmax_triton``."""
    if LM_HEAD_ARGMAX and lm_head_uses_gemv(x, weight):
        return gemv_argmax(x, weight, vocab_size, slots, last_tokens)
    logits = lm_head_matmul(x, weight)[:, :vocab_size]
    return logits, greedy_argmax_triton(logits, slots, last_tokens)
