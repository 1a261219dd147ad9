"""The logprobs of ``logprobs.py`` in Triton: one pass a row, in the model's dtype.

One program a row reads the row once, in blocks, and keeps in registers
its running maximum and the sum of ``exp(l - max)`` rescaled as the
maximum grows (the log-sum-exp), the first token that reaches the maximum
(the most likely token), and how many logits are at or above the sampled
token's, which it read first (the rank). Logprobs are then ``l - lse``.
The logits are read as the model produced them: no float32 copy of the
batch is made. More than one top token comes from ``torch.topk`` on those
logits (the cast to float32 keeps their order).

The sums run in another order than torch's ``log_softmax``, so the
logprobs agree with the reference to rounding, not bit for bit; the ranks
and the most likely token (the first on a tie) are exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.ops import pdl_launch
from runner.sampling.logprobs import LogprobsTensors, with_token_ids
from runner.triton_dependent_launch import wait_for_previous_kernel

# Logits a program reads per loop step, and its warps (as the filters').
BLOCK = 8192
NUM_WARPS = 16


@triton.jit
def _logprobs_kernel(
    logits_ptr, logits_stride, sampled_ptr, lse_ptr, sampled_logprob_ptr, rank_ptr,
    best_ptr, best_logprob_ptr, vocab_size, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    """Row ``program_id(0)``: its log-sum-exp, the sampled token's logprob
    and rank, the first most likely token and its logprob."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    sampled_value = tl.load(row_ptr + tl.load(sampled_ptr + row)).to(tl.float32)
    top = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    rank = tl.zeros((), tl.int32)
    best = tl.zeros((), tl.int32)
    for start in range(0, vocab_size, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + tokens, mask=tokens < vocab_size,
                    other=float("-inf")).to(tl.float32)
        rank += tl.sum((x >= sampled_value).to(tl.int32), axis=0)
        block_top, arg = tl.max(x, axis=0, return_indices=True,
                                return_indices_tie_break_left=True)
        best = tl.where(block_top > top, start + arg, best)
        new_top = tl.maximum(top, block_top)
        # Until a finite logit is seen the sum stays 0 (and no -inf - -inf).
        shift = tl.where(new_top > float("-inf"), new_top, 0.0)
        total = total * tl.exp(top - shift) + tl.sum(tl.exp(x - shift), axis=0)
        top = new_top
    lse = top + tl.log(total)
    tl.store(lse_ptr + row, lse)
    tl.store(sampled_logprob_ptr + row, sampled_value - lse)
    tl.store(rank_ptr + row, rank.to(tl.int64))
    tl.store(best_ptr + row, best.to(tl.int64))
    tl.store(best_logprob_ptr + row, top - lse)


def compute_logprobs_triton(
    raw_logits: torch.Tensor, sampled: torch.Tensor, num_top: int,
    token_ids: torch.Tensor | None = None,
) -> LogprobsTensors:
    """``compute_logprobs_ref`` in one launch (two with ``num_top`` > 1:
    ``torch.topk``; ``token_ids``: a gather of their logits, less the row's
    log-sum-exp)."""
    logits = raw_logits if raw_logits.stride(1) == 1 else raw_logits.contiguous()
    n, vocab_size = logits.shape
    num_top = min(num_top, vocab_size)
    device = logits.device
    lse, sampled_logprobs, best_logprobs = (
        torch.empty(n, dtype=torch.float32, device=device) for _ in range(3))
    ranks, best = (torch.empty(n, dtype=torch.int64, device=device) for _ in range(2))
    if n:
        _logprobs_kernel[(n,)](
            logits, logits.stride(0), sampled, lse, sampled_logprobs, ranks, best,
            best_logprobs, vocab_size, BLOCK=BLOCK, num_warps=NUM_WARPS,
            **pdl_launch(device),
        )  # fmt: skip
    if num_top <= 1:
        top_ids, top_logprobs = best[:, None][:, :num_top], best_logprobs[:, None][:, :num_top]
    else:
        top = logits.topk(num_top, dim=-1)
        top_ids, top_logprobs = top.indices, top.values.to(torch.float32) - lse[:, None]
    top_ids, top_logprobs = with_token_ids(
        top_ids, top_logprobs, token_ids,
        lambda ids: logits.gather(1, ids).to(torch.float32) - lse[:, None])
    return LogprobsTensors(top_token_ids=top_ids, top_logprobs=top_logprobs,
                           sampled_logprobs=sampled_logprobs, sampled_ranks=ranks)
