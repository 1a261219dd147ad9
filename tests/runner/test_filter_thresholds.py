"""The filters as thresholds on raw logits: the torch reference against the
filters themselves and a float64 reference, the Triton kernel (compiled on
CUDA, else under the interpreter) against the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runner.sampling import triton_filters
from runner.sampling.filters import apply_min_p, apply_top_k_top_p, filter_thresholds_ref
from runner.sampling.triton_filters import filter_thresholds_triton
from tests.helpers.kernel_device import KERNEL_DEVICE
from tests.helpers.sampling_reference import reference_allowed

# Per slot: temperature, top_k, top_p, min_p (the sampler's tables hold
# greedy slots with their filters off).
SLOTS = [
    (0.0, 0, 1.0, 0.0),  # greedy
    (1.0, 0, 1.0, 0.0),  # sampled, no filter
    (0.7, 5, 1.0, 0.0),  # top-k
    (1.3, 0, 0.9, 0.0),  # top-p
    (0.5, 0, 1.0, 0.05),  # min-p
    (1.0, 40, 0.8, 0.01),  # all three
    (2.0, 3, 0.3, 0.0),  # top-k, then top-p
    (1.0, 1, 1.0, 0.0),  # top-k 1: the argmax alone
    (0.9, 0, 1e-9, 0.0),  # top-p so small: the largest alone
    (1.0, 100000, 0.95, 0.0),  # top-k past the vocabulary: off
    (float("inf"), 2, 0.5, 0.1),  # every logit scales to 0 and ties: all kept
    (1.0, 1000, 1.0, 0.0),  # top-k far below the largest (below 0 at 1500 tokens)
]


def _tables(device):
    """The float table (temperature, top_p, min_p as its columns, as
    ``SamplingStates`` holds them) and the top-k table."""
    floats = torch.zeros(len(SLOTS), 6)
    for slot, (t, _, p, mp) in enumerate(SLOTS):
        floats[slot, 0], floats[slot, 1], floats[slot, 2] = t, p, mp
    top_k = torch.tensor([k for _, k, _, _ in SLOTS], dtype=torch.int32)
    floats, top_k = floats.to(device), top_k.to(device)
    return floats[:, 0], floats[:, 1], floats[:, 2], top_k


def _thresholds(fn, logits, slots, device):
    temperature, top_p, min_p, top_k = _tables(device)
    return fn(logits.to(device), slots.to(device), temperature, top_k, top_p, min_p,
              True, int(top_k.max()), True).cpu()


def _rows(dtype, vocab, seed):
    """One row a slot, the slots in shuffled order; one row with -inf
    entries (tokens masked before the filters)."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(len(SLOTS), generator=gen)
    logits = (3 * torch.randn(len(SLOTS), vocab, generator=gen)).to(dtype)
    logits[4, ::4] = float("-inf")
    return logits, slots


@pytest.mark.parametrize("vocab", [37, 1500])
def test_reference_thresholds_keep_what_the_filters_keep(vocab):
    # The threshold is the least raw logit the scaled filters keep: the
    # tokens at or above it are exactly the filters' set, and that set is
    # the float64 reference's.
    logits, slots = _rows(torch.float32, vocab, seed=vocab)
    got = _thresholds(filter_thresholds_ref, logits, slots, torch.device("cpu"))
    for row, slot in enumerate(slots.tolist()):
        t, k, p, mp = SLOTS[slot]
        if t == 0.0:
            assert got[row] == float("-inf")
            continue
        scaled = logits[row:row + 1] / t
        filtered = apply_top_k_top_p(apply_min_p(scaled, torch.tensor([mp])),
                                     torch.tensor([k]), torch.tensor([p]), k, True)[0]
        kept = logits[row] >= got[row]
        assert torch.equal(kept, filtered > float("-inf")), row
        if t == float("inf"):
            assert bool(kept[logits[row] > float("-inf")].all())  # all tie at 0
            continue  # the float64 reference breaks ties by position
        want = reference_allowed(logits[row].numpy(), t, top_k=k, top_p=p, min_p=mp)
        assert np.array_equal(kept.numpy(), want & np.isfinite(logits[row].numpy())), row


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [37, 1500, 5000])
@pytest.mark.parametrize("step_bins", [1, 16, 256, 2048])
def test_triton_thresholds_keep_the_reference_sets(monkeypatch, dtype, vocab, step_bins):
    # Counts decide top-k exactly; sums decide top-p in another order, so
    # the kept sets (not the thresholds' values) are compared, on rows whose
    # boundaries lie far from rounding. 16-bit rows tie often: ties with
    # the threshold are kept by both. The rows with top-k count the steps
    # (the batch has top-k), the rows with top-p alone bisect beside them:
    # 16 bins hold few thresholds (the bisections then run over the whole
    # row), 256 (the default) the top-k 40 and lower ones, 2048 all but
    # those below 0.
    monkeypatch.setattr(triton_filters, "STEP_BINS", step_bins)
    logits, slots = _rows(dtype, vocab, seed=vocab + 1)
    want = _thresholds(filter_thresholds_ref, logits, slots, torch.device("cpu"))
    got = _thresholds(filter_thresholds_triton, logits, slots, KERNEL_DEVICE)
    raw = logits.float()
    finite = raw > float("-inf")  # a -inf token is never drawn, kept or not
    for row, slot in enumerate(slots.tolist()):
        if SLOTS[slot][0] == 0.0:
            assert got[row] == float("-inf")
            continue
        assert torch.equal(finite[row] & (raw[row] >= got[row]),
                           finite[row] & (raw[row] >= want[row])), (row, SLOTS[slot])
    top1 = slots.tolist().index(7)
    assert int((raw[top1] >= got[top1]).sum()) == 1


def test_triton_thresholds_of_rows_with_nothing_or_one_value():
    # A row of -inf (everything masked) keeps everything it has (nothing to
    # draw from but token 0, as without filters); a row of one repeated value
    # keeps all of it (ties with the threshold stay).
    slots = torch.tensor([5, 6])
    logits = torch.full((2, 300), float("-inf"))
    logits[1, :] = 1.5
    got = _thresholds(filter_thresholds_triton, logits, slots, KERNEL_DEVICE)
    assert got[0] == float("-inf")
    assert bool((logits[1] >= got[1]).all())
