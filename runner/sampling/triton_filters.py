"""The filters' thresholds (``filters.filter_thresholds_ref``) in Triton, without a sort.

One program a row finds, on the raw logits:

- min-p: ``max + t * log(min_p)`` (the scaled rule ``l/t >= max/t + log(min_p)``
  multiplied out by the temperature t);
- top-k: the k-th largest logit, the largest value v with at least k
  logits >= v;
- top-p: over the tokens min-p and top-k keep, the smallest logit v whose
  tokens above it (strictly) hold less than top_p of their probability
  mass, ``exp((l - max) / t)`` normalised;

each by a bisection over the ordered bit patterns of float32 (``_key``):
every probe is one pass over the row that counts the logits at or above
it, or sums the mass above it. Both quantities only change at a logit
present in the row, so the bisection ends on one. A 16-bit dtype's values
fill only every 2**16-th pattern (bfloat16; 2**13-th for float16), so the
bisection steps over those alone: about 16 passes a filter instead of 32.

The thresholds are exact where counts decide (top-k); where sums decide
(top-p) the kernel sums in another order than the reference's sorted
cumulative sum, and min-p's logarithm is rounded on the device, so a token
whose mass sits within rounding of the boundary may be kept by one and not
the other. Every rank runs the same program on the same logits, and its
sums run in a fixed order, so the ranks agree.

Rows are independent: one program a row, which reads its row from the cache
once a pass. The top-p bisection starts above the value below which the
tokens could hold at most half of 1 - top_p of the mass, which halves its
passes on a peaked row.

A row with top-k spares its bisections by a histogram first (``STEP_BINS``):
one pass counts the row's logits in each bfloat16 step below its largest.
The step where the running count reaches k holds the top-k threshold (a
bfloat16 row's threshold is that step; a float16 or float32 row's
bisection is left within it). In a bfloat16 row every logit of a step has
the step's value, so the counts also give each step's mass, and where the
tokens top-k keeps all lie in the counted steps, top-p is the last step
with less than top_p of the mass above it. Either bisection runs as before
where its threshold lies below the steps counted. A row with top-p and no
top-k bisects: its threshold lies wherever the row's mass puts it, often
below the counted steps on a flat row, where the counting pass would be
paid for nothing. A batch without top-k is launched with one bin, so its
kernel holds none of the histogram's code (nor its registers).

An infinite temperature scales every finite logit to 0, so they all tie and
every filter keeps them all.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.ops import pdl_launch
from runner.triton_dependent_launch import wait_for_previous_kernel

LOG2E = tl.constexpr(1.4426950408889634)
_KEY_SHIFT = {torch.bfloat16: 16, torch.float16: 13, torch.float32: 0}
# Logits a program reads per loop step, and its warps: a pass is a loop
# over the row whose steps wait on the cache, so wider steps keep more
# reads in flight.
BLOCK = 8192
NUM_WARPS = 16
# Steps of bfloat16 below a row's largest logit that one pass counts (a
# histogram) in a row with top-k; 1: none, the bisections run over the
# row's whole range.
STEP_BINS = 256


@triton.jit
def _key(x):
    """float32 -> int32 whose order is the floats' order (-0.0 just below +0.0)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _value(coarse, SHIFT: tl.constexpr):
    """The float32 of coarse key ``coarse`` (a key >> SHIFT), whose dropped
    low bits are those every value of the dtype has: 0 for a positive key,
    all ones for a negative one (``_key`` flips a negative's bits)."""
    low = tl.where(coarse < 0, (1 << SHIFT) - 1, 0)
    key = ((coarse << SHIFT) | low).to(tl.int32)
    return (key ^ ((key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _count_at_least(row_ptr, v, vocab_size, BLOCK: tl.constexpr):
    count = tl.zeros((), tl.int32)
    for start in range(0, vocab_size, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + tokens, mask=tokens < vocab_size, other=float("-inf"))
        count += tl.sum((x.to(tl.float32) >= v).to(tl.int32), axis=0)
    return count


@triton.jit
def _mass_above(row_ptr, v, floor, top, scale, vocab_size, BLOCK: tl.constexpr):
    """Unnormalised mass exp2((l - top) * scale) of the logits l > v that are >= floor."""
    mass = tl.zeros((), tl.float32)
    for start in range(0, vocab_size, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + tokens, mask=tokens < vocab_size,
                    other=float("-inf")).to(tl.float32)
        kept = (x > v) & (x >= floor)
        mass += tl.sum(tl.where(kept, tl.exp2((x - top) * scale), 0.0), axis=0)
    return mass


@triton.jit
def _step_counts(row_ptr, top_bin, vocab_size, STEP_BINS: tl.constexpr, BLOCK: tl.constexpr):
    """int32 [STEP_BINS]: how many logits lie j bfloat16 steps below the
    step ``top_bin`` (a ``_key`` >> 16) for j < STEP_BINS - 1, and 0."""
    counts = tl.zeros((STEP_BINS,), tl.int32)
    for start in range(0, vocab_size, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + tokens, mask=tokens < vocab_size,
                    other=float("-inf")).to(tl.float32)
        steps = tl.minimum(tl.maximum(top_bin - (_key(x) >> 16), 0), STEP_BINS - 1)
        # Most of a row lies further down: left out of the counts, the last
        # bin stays 0 (and no thread waits on it).
        counts += tl.histogram(steps, STEP_BINS, mask=steps < STEP_BINS - 1)
    return counts


@triton.jit
def _filter_thresholds_kernel(
    logits_ptr, logits_stride, slots_ptr, temperature_ptr, top_p_ptr, min_p_ptr,
    float_stride, top_k_ptr, out_ptr, vocab_size,
    MIN_P: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr,
    SHIFT: tl.constexpr, STEP_BINS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    """One row: its threshold (-inf: keep all) into ``out_ptr[row]``."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    slot = tl.load(slots_ptr + row)
    t = tl.load(temperature_ptr + slot * float_stride)
    # The row's largest and smallest finite logits and how many are finite.
    top = tl.full((), float("-inf"), tl.float32)
    bottom = tl.full((), float("inf"), tl.float32)
    num_finite = tl.zeros((), tl.int32)
    for start in range(0, vocab_size, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + tokens, mask=tokens < vocab_size,
                    other=float("-inf")).to(tl.float32)
        finite = (x > float("-inf")) & (x < float("inf"))
        top = tl.maximum(top, tl.max(tl.where(finite, x, float("-inf")), axis=0))
        bottom = tl.minimum(bottom, tl.min(tl.where(finite, x, float("inf")), axis=0))
        num_finite += tl.sum(finite.to(tl.int32), axis=0)
    # At an infinite temperature every finite logit scales to 0: they tie,
    # and every filter keeps them all.
    sampled = (t != 0.0) & (t < float("inf")) & (num_finite > 0)
    threshold = tl.full((), float("-inf"), tl.float32)
    if MIN_P:
        min_p = tl.load(min_p_ptr + slot * float_stride)
        if sampled & (min_p > 0.0):
            threshold = top + t * tl.log(min_p)
    lo = (_key(bottom) >> SHIFT).to(tl.int64)
    hi = (_key(top) >> SHIFT).to(tl.int64)
    k = tl.zeros((), tl.int32)
    if TOP_K:
        k = tl.load(top_k_ptr + slot)
    top_p = tl.full((), 1.0, tl.float32)
    if TOP_P:
        top_p = tl.load(top_p_ptr + slot * float_stride)
    want_k = sampled & (k > 0) & (k < num_finite)
    want_p = sampled & (top_p < 1.0)
    # Bin j of the steps counts the logits j bfloat16 steps below the
    # largest; the last bin stands for everything further down (uncounted).
    top_bin = _key(top) >> 16
    bins = tl.arange(0, STEP_BINS)
    counts = tl.zeros((STEP_BINS,), tl.int32)
    scale = LOG2E / tl.where(sampled, t, 1.0)  # used where sampled
    if STEP_BINS > 1:
        if want_k:
            counts = _step_counts(row_ptr, top_bin, vocab_size, STEP_BINS, BLOCK)
    if want_k:
        # The largest coarse key whose value has >= k logits at or above it.
        k_lo = lo
        k_hi = hi
        if STEP_BINS > 1:
            # The step where the running count reaches k holds it (a
            # bfloat16 row's threshold is that step), unless it lies below
            # the steps counted.
            below_k = tl.sum((tl.cumsum(counts, 0) < k).to(tl.int32), axis=0)
            if below_k < STEP_BINS - 1:
                first = (top_bin - below_k).to(tl.int64) << (16 - SHIFT)
                k_lo = tl.maximum(lo, first)
                k_hi = tl.minimum(hi, first + (1 << (16 - SHIFT)) - 1)
        while k_lo < k_hi:
            mid = k_lo + (k_hi - k_lo + 1) // 2
            if _count_at_least(row_ptr, _value(mid, SHIFT), vocab_size, BLOCK) >= k:
                k_lo = mid
            else:
                k_hi = mid - 1
        threshold = tl.maximum(threshold, _value(k_lo, SHIFT))
    if want_p:
        p_found = tl.zeros((), tl.int32)
        if STEP_BINS > 1 and SHIFT == 16:
            # A bfloat16 row's logits in one step are one value: the steps'
            # counts give their masses, and the mass strictly above a step
            # is that of the steps before it. Where every token kept so far
            # lies in the counted steps, their masses are all the mass, and
            # the last step with less than top_p of it above is the answer.
            steps = top_bin - bins  # below -2**15 no float's step: no value
            values = _value(steps, 16)
            kept = (bins < STEP_BINS - 1) & (steps >= -32768) & (values >= threshold)
            masses = tl.where(kept, counts.to(tl.float32) * tl.exp2((values - top) * scale), 0.0)
            all_counted = top_bin - (_key(threshold) >> 16) < STEP_BINS - 1
            if want_k & all_counted:
                total = tl.sum(masses, axis=0)
                before = tl.cumsum(masses, 0) - masses
                last = tl.sum((kept & (before < top_p * total)).to(tl.int32), axis=0) - 1
                threshold = tl.maximum(threshold, tl.max(
                    tl.where(bins == last, values, float("-inf")), axis=0))
                p_found = 1
        if p_found == 0:
            total = _mass_above(row_ptr, tl.full((), float("-inf"), tl.float32), threshold, top,
                                scale, vocab_size, BLOCK)
            # The smallest coarse key at or above the threshold so far whose
            # value has less than top_p of the mass strictly above it. It
            # lies above every u whose tokens at or below it, at most
            # num_finite of them, hold under half of 1 - top_p of the mass
            # (u's own mass above then exceeds top_p): the search starts there.
            u = top + (tl.log2((1.0 - top_p) * total / num_finite) - 1.0) / scale
            p_lo = tl.maximum(lo, (_key(threshold) >> SHIFT).to(tl.int64))
            p_lo = tl.maximum(p_lo, (_key(u) >> SHIFT).to(tl.int64))
            p_hi = hi
            while p_lo < p_hi:
                mid = p_lo + (p_hi - p_lo) // 2
                above = _mass_above(row_ptr, _value(mid, SHIFT), threshold, top, scale,
                                    vocab_size, BLOCK)
                if above < top_p * total:
                    p_hi = mid
                else:
                    p_lo = mid + 1
            threshold = tl.maximum(threshold, _value(p_lo, SHIFT))
    tl.store(out_ptr + row, threshold)


def filter_thresholds_triton(
    logits: torch.Tensor, slots: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
    top_p: torch.Tensor, min_p: torch.Tensor, any_min_p: bool, max_top_k: int, any_top_p: bool,
) -> torch.Tensor:
    """``filter_thresholds_ref`` in one launch of one program a row.
    ``temperature``, ``top_p`` and ``min_p`` are columns of one table
    (one stride); the host flags leave out the filters no row uses."""
    logits = logits.contiguous()
    n, vocab_size = logits.shape
    out = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n == 0:
        return out
    assert temperature.stride(0) == top_p.stride(0) == min_p.stride(0)
    _filter_thresholds_kernel[(n,)](
        logits, logits.stride(0), slots, temperature, top_p, min_p, temperature.stride(0),
        top_k, out, vocab_size, MIN_P=any_min_p, TOP_K=max_top_k > 0, TOP_P=any_top_p,
        SHIFT=_KEY_SHIFT[logits.dtype], STEP_BINS=STEP_BINS if max_top_k > 0 else 1,
        BLOCK=BLOCK, num_warps=NUM_WARPS,
        **pdl_launch(logits.device),
    )  # fmt: skip
    return out
