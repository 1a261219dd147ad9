"""The penalties' kernels (``runner/sampling/triton_penalties.py``, compiled
on CUDA, else under the interpreter) against the torch reference, bit for
bit; the reference's prior tokens against vLLM's definitions in float64."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from runner.sampling import triton_penalties
from runner.sampling.penalties import apply_penalties_ref, record_sampled_ref
from tests.helpers.kernel_device import KERNEL_DEVICE

# Per slot: repetition, presence, frequency (columns 3-5 of the sampler's
# float table); slot 3 has no penalty.
PARAMS = [(1.8, 0.0, 0.0), (1.0, 1.5, 0.7), (0.6, -0.5, 1.1), (1.0, 0.0, 0.0), (1.3, 0.2, -0.4)]


def _state(vocab: int, seed: int):
    """The float table (its penalty columns a strided view, as the sampler
    passes them), output counts and prompt masks of ``PARAMS``' slots."""
    gen = torch.Generator().manual_seed(seed)
    floats = torch.zeros(len(PARAMS), 6)
    floats[:, 3:] = torch.tensor(PARAMS)
    counts = torch.randint(0, 4, (len(PARAMS), vocab), generator=gen, dtype=torch.int32)
    counts *= torch.rand(len(PARAMS), vocab, generator=gen) < 0.1
    prompt_mask = torch.rand(len(PARAMS), vocab, generator=gen) < 0.1
    return floats, counts, prompt_mask, gen


def _columns(floats):
    """The penalties' columns of the float table, as the sampler passes them."""
    return floats[:, 3:]


def _logits(rows: int, vocab: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Positive, negative, zero and -inf (a grammar's mask) logits."""
    logits = 3 * torch.randn(rows, vocab, generator=gen)
    logits[:, ::7] = 0.0
    logits[0, ::5] = float("-inf")
    return logits.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [37, 2500])
@pytest.mark.parametrize("with_prior", [False, True])
def test_triton_penalties_equal_the_reference(dtype, vocab, with_prior):
    floats, counts, prompt_mask, gen = _state(vocab, seed=vocab)
    # Slots in any order, one slot on three rows (the draft positions of
    # speculative decoding, each with the drafts before it).
    slots = torch.tensor([2, 4, 0, 4, 4, 3, 1])
    logits = _logits(len(slots), vocab, dtype, gen)
    prior = None
    if with_prior:
        prior = torch.full((len(slots), 3), -1, dtype=torch.int64)
        prior[3, 0] = 5
        prior[4, :2] = torch.tensor([5, 11])
        prior[6, :] = torch.tensor([vocab - 1, vocab - 1, 2])
    want = apply_penalties_ref(logits, slots, _columns(floats), counts, prompt_mask, prior)
    d = KERNEL_DEVICE
    got = triton_penalties.apply_penalties_triton(
        logits.to(d), slots.to(d), _columns(floats.to(d)), counts.to(d), prompt_mask.to(d),
        None if prior is None else prior.to(d))
    assert got.dtype == torch.float32
    assert torch.equal(got.cpu(), want)
    assert not torch.equal(want, logits.float())  # the penalties changed something


def test_reference_counts_prior_tokens_as_outputs():
    # vLLM's definitions token by token in float64, on outputs that include
    # the prior tokens (drafts before the row's position).
    vocab = 40
    floats, counts, prompt_mask, gen = _state(vocab, seed=3)
    slots = torch.tensor([1, 2, 0])
    logits = _logits(3, vocab, torch.float32, gen)
    prior = torch.tensor([[7, 7, -1], [9, -1, -1], [-1, -1, -1]])
    got = apply_penalties_ref(logits, slots, _columns(floats), counts, prompt_mask, prior)
    for row, slot in enumerate(slots.tolist()):
        rep, pres, freq = PARAMS[slot]
        outputs = Counter({t: int(c) for t, c in enumerate(counts[slot].tolist()) if c})
        outputs.update(t for t in prior[row].tolist() if t >= 0)
        want = logits[row].double().clone()
        for t in range(vocab):
            if bool(prompt_mask[slot, t]) or outputs[t] > 0:
                want[t] = want[t] / rep if want[t] > 0 else want[t] * rep
            want[t] -= freq * outputs[t] + pres * (outputs[t] > 0)
        torch.testing.assert_close(got[row].double(), want, rtol=1e-6, atol=1e-6)


def test_triton_record_adds_every_real_sample():
    # Rows of one slot may draw the same token: each counts.
    vocab = 50
    _, counts, _, _ = _state(vocab, seed=4)
    slots = torch.tensor([4, 4, 4, 0, 2, 1])
    sampled = torch.tensor([7, 7, 9, 7, 49, 0])
    mask = torch.tensor([True, True, True, False, True, True])
    want = counts.clone()
    record_sampled_ref(want, slots, sampled, mask)
    assert want[4, 7] == counts[4, 7] + 2 and want[0, 7] == counts[0, 7]
    got = counts.to(KERNEL_DEVICE)
    triton_penalties.record_sampled_triton(got, slots.to(KERNEL_DEVICE),
                                           sampled.to(KERNEL_DEVICE), mask.to(KERNEL_DEVICE))
    assert torch.equal(got.cpu(), want)
