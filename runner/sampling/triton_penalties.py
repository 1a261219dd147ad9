"""The penalties of ``penalties.py`` in Triton: one launch applies them, one counts the samples.

``apply_penalties_triton``: one program per (row, vocab block) reads its
row's repetition, presence and frequency penalties at the row's slot in
the per-slot table, its slot's output counts and prompt mask, adds the
row's prior tokens to the counts in registers, and writes the penalised
float32 logits: one read of each [N, V] input and one write, where the
torch reference makes about fifteen passes over [N, V] temporaries. The
arithmetic is the reference's, operation for operation: the division is
rounded as torch divides, and the kernel is compiled without fused
multiply-adds (``enable_fp_fusion=False``), so ``l - f * c`` rounds the
product before the difference as torch does. The results are equal bit
for bit.

``record_sampled_triton``: one program adds one to the count of every real
sample (atomic adds: rows of one slot, the draft positions of speculative
decoding, may count the same token).

Both launch with programmatic dependent launch where the device has it
(``runner/triton_dependent_launch.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.ops import pdl_launch
from runner.triton_dependent_launch import wait_for_previous_kernel

# Logits a program reads: a row of 128k tokens is 128 programs.
BLOCK = 1024


@triton.jit
def _penalties_kernel(
    logits_ptr,
    logits_stride,
    out_ptr,
    slots_ptr,
    penalties_ptr,
    penalties_stride,
    counts_ptr,
    counts_stride,
    prompt_mask_ptr,
    prompt_mask_stride,
    prior_ptr,
    prior_stride,
    vocab_size,
    NUM_PRIOR: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Row ``program_id(0)``'s logits of block ``program_id(1)``, penalised
    with its slot's parameters and counts (``apply_penalties_ref``)."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = tokens < vocab_size
    slot = tl.load(slots_ptr + row)
    repetition = tl.load(penalties_ptr + slot * penalties_stride)
    presence = tl.load(penalties_ptr + slot * penalties_stride + 1)
    frequency = tl.load(penalties_ptr + slot * penalties_stride + 2)
    logits = tl.load(logits_ptr + row * logits_stride + tokens, mask=inside).to(tl.float32)
    counts = tl.load(counts_ptr + slot * counts_stride + tokens, mask=inside, other=0)
    for j in tl.static_range(NUM_PRIOR):
        prior = tl.load(prior_ptr + row * prior_stride + j)
        counts += (tokens == prior).to(counts.dtype)
    in_output = counts > 0
    in_prompt = tl.load(prompt_mask_ptr + slot * prompt_mask_stride + tokens, mask=inside,
                        other=0) != 0
    scale = tl.where(in_prompt | in_output, repetition, 1.0)
    out = tl.where(logits > 0, tl.div_rn(logits, scale), logits * scale)
    out = out - frequency * counts.to(tl.float32)
    out = out - presence * in_output.to(tl.float32)
    tl.store(out_ptr + row * vocab_size + tokens, out, mask=inside)


@triton.jit
def _record_kernel(counts_ptr, counts_stride, slots_ptr, sampled_ptr, mask_ptr, num_rows,
                   ROWS: tl.constexpr, PDL: tl.constexpr):
    """Adds one at (slot, sampled token) of every row whose mask is set."""
    wait_for_previous_kernel(PDL)
    rows = tl.arange(0, ROWS)
    real = rows < num_rows
    slots = tl.load(slots_ptr + rows, mask=real, other=0)
    sampled = tl.load(sampled_ptr + rows, mask=real, other=0)
    real &= tl.load(mask_ptr + rows, mask=real, other=0) != 0
    tl.atomic_add(counts_ptr + slots * counts_stride + sampled, 1, mask=real, sem="relaxed")


def apply_penalties_triton(
    logits: torch.Tensor, slots: torch.Tensor, slot_penalties: torch.Tensor,
    output_counts: torch.Tensor, prompt_mask: torch.Tensor,
    prior_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``penalties.apply_penalties_ref`` in one launch."""
    if slot_penalties.stride(1) != 1:
        raise ValueError("a slot's three penalties must be adjacent (stride 1)")
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    n, vocab_size = logits.shape
    out = torch.empty(n, vocab_size, dtype=torch.float32, device=logits.device)
    if n == 0:
        return out
    prior = prior_tokens if prior_tokens is not None else slots[:, None]
    _penalties_kernel[(n, triton.cdiv(vocab_size, BLOCK))](
        logits, logits.stride(0), out, slots, slot_penalties, slot_penalties.stride(0),
        output_counts, output_counts.stride(0),
        prompt_mask.view(torch.uint8), prompt_mask.stride(0), prior, prior.stride(0),
        vocab_size, NUM_PRIOR=0 if prior_tokens is None else prior_tokens.shape[1],
        BLOCK=BLOCK, enable_fp_fusion=False, **pdl_launch(logits.device),
    )  # fmt: skip
    return out


def record_sampled_triton(output_counts: torch.Tensor, slots: torch.Tensor,
                          sampled: torch.Tensor, sample_mask: torch.Tensor) -> None:
    """``penalties.record_sampled_ref`` in one launch."""
    n = slots.shape[0]
    if n == 0:
        return
    _record_kernel[(1,)](
        output_counts, output_counts.stride(0), slots, sampled, sample_mask.view(torch.uint8),
        n, ROWS=triton.next_power_of_2(n), **pdl_launch(output_counts.device),
    )  # fmt: skip
