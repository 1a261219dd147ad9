"""Triton LoRA delta: each token reads only its own adapter slot's factors.

``lora_add_delta_triton`` is ``stack.lora_add_delta_ref`` on CUDA (one
signature, ``runner.ops``): y += (x @ A_s^T) @ B_s^T for each token whose
slot s = ``token_slot[t]`` is >= 0; a token of slot -1 is not touched (its
delta is exactly zero). Two launches a projection, whatever the number of
slots:

- shrink: program (token block i, split j) computes, for each token of its
  block, x[t, K range j] against the P * R rows of A of the token's slot
  (every part's), into a float32 partial [splits, T, P * R]. K is split so
  that a few tokens still give the SMs enough programs (a decode batch of
  one token reads a 14336-wide A in 16 programs, not one); no atomics: the
  expand sums the splits.
- expand: program (token block i, output block n) sums a token's splits
  into its P * R shrunk values, reads of B the R columns of the slot's part
  that owns each output row (``part_ends``: B is zero outside them), and
  adds the product into y in place.

The products are vector multiply-and-sum on the CUDA cores (no ``tl.dot``):
with R <= 64 the delta reads far fewer bytes than the base weight, and the
same code serves decode (one token a program) and prefill (TOKENS_PER_BLOCK
tokens a program; consecutive tokens of a prefill share a request, so the
factor tiles a program reads again come from its cache). Static shapes
and no host work, so both launches are captured in the decode graphs;
the partial is allocated in the graph's pool.

Where they run: steps of at most ``LORA_TRITON_MAX_TOKENS`` tokens, the
one-token-a-program sizes (``DECODE_MAX_TOKENS``). On one GPU at the 8B's
shapes (4 adapters of rank 16) the kernels took decode steps of 1 to 16
rows 10-13% below the masked form, and a 32-row step 25% above it (the
masked form's two matmuls reuse each factor tile across 32 tokens on the
tensor cores; the kernels read each token's factors again on the CUDA
cores): more tokens take the masked form. ``LORA_TRITON`` off sends every
call there (``benchmarks/decode_variants.py``: ``lora-masked``, and
``lora-triton-all`` for the kernels at every size).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.lora.stack import lora_add_delta_ref
from runner.ops import num_sms, pdl_launch
from runner.triton_dependent_launch import wait_for_previous_kernel

# The delta through these kernels (False: the torch masked form), for steps
# of at most LORA_TRITON_MAX_TOKENS tokens (module docstring).
LORA_TRITON = True
DECODE_MAX_TOKENS = 16  # up to this many tokens, one token a program
LORA_TRITON_MAX_TOKENS = DECODE_MAX_TOKENS
TOKENS_PER_BLOCK = 8  # tokens a program past DECODE_MAX_TOKENS
SHRINK_BLOCK_K = 128
EXPAND_BLOCK_N = 64
MAX_SPLIT_K = 16


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, slot_ptr, partial_ptr, T, K, K_PER_SPLIT, stride_x, stride_a,
                   PR: tl.constexpr, BLOCK_PR: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """partial[j, t, :PR] = x[t, K range j] . A[slot(t) * PR + :PR, K range j]
    for the tokens of block i with a slot; others are not written (nothing
    reads them)."""
    wait_for_previous_kernel(PDL)
    block = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_PR)
    row_mask = rows < PR
    k_lo = split * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    for i in range(BLOCK_M):
        t = block * BLOCK_M + i
        if t < T:
            slot = tl.load(slot_ptr + t)
            if slot >= 0:
                a_rows = (slot * PR + rows).to(tl.int64)
                acc = tl.zeros([BLOCK_PR], dtype=tl.float32)
                for k0 in range(k_lo, k_hi, BLOCK_K):
                    ks = k0 + tl.arange(0, BLOCK_K)
                    k_mask = ks < k_hi
                    x = tl.load(x_ptr + t.to(tl.int64) * stride_x + ks, mask=k_mask, other=0.0)
                    a = tl.load(a_ptr + a_rows[:, None] * stride_a + ks[None, :],
                                mask=row_mask[:, None] & k_mask[None, :], other=0.0)
                    acc += tl.sum(a.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
                tl.store(partial_ptr + (split * T + t).to(tl.int64) * PR + rows, acc,
                         mask=row_mask)


@triton.jit
def _expand_kernel(partial_ptr, b_ptr, slot_ptr, y_ptr, T, N, SPLITS, END0, END1, stride_b,
                   stride_y, R: tl.constexpr, PR: tl.constexpr, BLOCK_PR: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """y[t, n] += sum_r shrunk[t, p(n) * R + r] * B[n, (slot(t) * P + p(n)) * R + r]
    for the tokens of block i with a slot and outputs n of block j; p(n), the
    part that owns row n, from the part ends (END0, END1; N the last)."""
    wait_for_previous_kernel(PDL)
    block = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    part = (cols >= END0).to(tl.int32) + (cols >= END1).to(tl.int32)
    j = tl.arange(0, BLOCK_PR)
    owned = (j[None, :] // R == part[:, None]) & (j < PR)[None, :] & col_mask[:, None]
    b_rows = cols.to(tl.int64) * stride_b
    for i in range(BLOCK_M):
        t = block * BLOCK_M + i
        if t < T:
            slot = tl.load(slot_ptr + t)
            if slot >= 0:
                shrunk = tl.zeros([BLOCK_PR], dtype=tl.float32)
                for s in range(SPLITS):
                    shrunk += tl.load(partial_ptr + (s * T + t).to(tl.int64) * PR + j,
                                      mask=j < PR, other=0.0)
                b = tl.load(b_ptr + b_rows[:, None] + slot * PR + j[None, :], mask=owned,
                            other=0.0)
                delta = tl.sum(b.to(tl.float32) * shrunk[None, :], axis=1)
                out = y_ptr + t.to(tl.int64) * stride_y + cols
                y = tl.load(out, mask=col_mask, other=0.0)
                tl.store(out, (y.to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=col_mask)


def tokens_per_program(num_tokens: int) -> int:
    """One token a program for decode batches, TOKENS_PER_BLOCK beyond."""
    return 1 if num_tokens <= DECODE_MAX_TOKENS else TOKENS_PER_BLOCK


def shrink_splits(token_blocks: int, k: int, sms: int) -> int:
    """K splits of the shrink: enough programs for two waves of the SMs,
    at most MAX_SPLIT_K and one SHRINK_BLOCK_K tile a split."""
    return max(1, min(triton.cdiv(2 * sms, token_blocks), triton.cdiv(k, SHRINK_BLOCK_K),
                      MAX_SPLIT_K))


def lora_shrink(x: torch.Tensor, a: torch.Tensor, token_slot: torch.Tensor,
                slot_rows: int) -> torch.Tensor:
    """float32 partial sums [splits, T, slot_rows]: for each token with a
    slot s >= 0, splits summing to x[t] @ a[s * slot_rows : (s + 1) *
    slot_rows]^T (rows of tokens without a slot are left unwritten)."""
    t, k = x.shape
    block_m = tokens_per_program(t)
    token_blocks = triton.cdiv(t, block_m)
    splits = shrink_splits(token_blocks, k, num_sms(x.device))
    k_per_split = triton.cdiv(triton.cdiv(k, splits), SHRINK_BLOCK_K) * SHRINK_BLOCK_K
    splits = triton.cdiv(k, k_per_split)
    partial = torch.empty(splits, t, slot_rows, dtype=torch.float32, device=x.device)
    if t == 0:
        return partial
    _shrink_kernel[(token_blocks, splits)](
        x, a, token_slot, partial, t, k, k_per_split, x.stride(0), a.stride(0),
        PR=slot_rows, BLOCK_PR=triton.next_power_of_2(slot_rows), BLOCK_M=block_m,
        BLOCK_K=SHRINK_BLOCK_K, **pdl_launch(x.device))
    return partial


def lora_expand_add(partial: torch.Tensor, b: torch.Tensor, token_slot: torch.Tensor,
                    y: torch.Tensor, part_ends: tuple[int, ...], rank: int) -> torch.Tensor:
    """y (written in place, and returned) += for each token with a slot the
    sum of its ``partial`` splits times that slot's B columns of the part
    that owns each output row (``part_ends``, at most three parts)."""
    splits, t, slot_rows = partial.shape
    n = y.shape[1]
    ends = (*part_ends[:-1], n, n)
    block_m = tokens_per_program(t)
    if t == 0:
        return y
    grid = (triton.cdiv(t, block_m), triton.cdiv(n, EXPAND_BLOCK_N))
    _expand_kernel[grid](
        partial, b, token_slot, y, t, n, splits, ends[0], ends[1], b.stride(0), y.stride(0),
        R=rank, PR=slot_rows, BLOCK_PR=triton.next_power_of_2(slot_rows), BLOCK_M=block_m,
        BLOCK_N=EXPAND_BLOCK_N, **pdl_launch(y.device))
    return y


def lora_add_delta_triton(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                          token_mask: torch.Tensor, token_slot: torch.Tensor,
                          part_ends: tuple[int, ...]) -> torch.Tensor:
    """``lora_add_delta_ref`` through the shrink and expand kernels, y
    updated in place (unit last strides, at most three parts); the
    reference where LORA_TRITON is off, the step has more than
    LORA_TRITON_MAX_TOKENS tokens or the layout is not the kernels'."""
    if (not LORA_TRITON or x.shape[0] > LORA_TRITON_MAX_TOKENS or len(part_ends) > 3
            or x.stride(-1) != 1 or y.stride(-1) != 1 or a.stride(-1) != 1
            or b.stride(-1) != 1):
        return lora_add_delta_ref(x, y, a, b, token_mask, token_slot, part_ends)
    parts, num_slots = len(part_ends), token_mask.shape[1]
    slot_rows = a.shape[0] // num_slots  # P * R
    partial = lora_shrink(x, a, token_slot, slot_rows)
    return lora_expand_add(partial, b, token_slot, y, part_ends, slot_rows // parts)
