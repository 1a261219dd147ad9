"""The rejection sampler is lossless: tokens through it follow the target
distribution whatever the drafts, checked by a chi-square test that a 5%
distortion of the target fails; greedy acceptance and penalties by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ipc.messages import SamplingOptions
from runner.sampler import Sampler
from runner.spec_decode.rejection import DraftLayout, RejectionSampler, accept_with_probs
from tests.helpers.sampler_writes import write_added_requests

VOCAB = 8
DRAWS = 40_000
# Upper 0.1% point of chi-square with VOCAB - 1 = 7 degrees of freedom.
CHI2_CRITICAL = 24.32
TARGET_LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, 1.5, -1.0, 0.2])
# A draft distribution far from the target: mostly token 6, the target's rarest.
DRAFT_PROBS = torch.tensor([0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.86, 0.02])


def _chi2(tokens: np.ndarray, probs: np.ndarray) -> float:
    counts = np.bincount(tokens, minlength=len(probs))
    expected = probs * len(tokens)
    return float(((counts - expected) ** 2 / expected).sum())


def _distorted(probs: np.ndarray) -> np.ndarray:
    """The target with 5% of its mass moved onto its most likely token."""
    out = probs * 0.95
    out[probs.argmax()] += 0.05
    return out


def _one_draft_rows(num_rows: int) -> DraftLayout:
    """Batch rows of one draft each: logits rows 2i (draft) and 2i + 1 (bonus)."""
    cu = torch.arange(0, 2 * num_rows + 1, 2, dtype=torch.int32)
    return DraftLayout.build(cu, num_rows, 2 * num_rows, 2)


def _sampler(num_rows: int, temperature: float, seed: int) -> Sampler:
    sampler = Sampler(num_rows, VOCAB, torch.device("cpu"), seed=0)
    for slot in range(num_rows):
        sampler.add_request(slot, SamplingOptions(temperature=temperature, seed=seed + slot), 1,
                            1)
    write_added_requests(sampler, torch.zeros(num_rows, 4, dtype=torch.int32))
    return sampler


def _first_tokens_point_mass(temperature: float) -> np.ndarray:
    """First emitted token of DRAWS rows whose single draft is drawn from
    DRAFT_PROBS (a point mass per row, deliberately from the wrong law)."""
    rows = DRAWS
    sampler = _sampler(rows, temperature, seed=1000)
    rejection = RejectionSampler(sampler, 1)
    layout = _one_draft_rows(rows)
    gen = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(DRAFT_PROBS, rows, replacement=True, generator=gen)
    drafts = torch.stack([drafts, torch.zeros_like(drafts)], 1).flatten()
    logits = TARGET_LOGITS.repeat(2 * rows, 1)
    positions = torch.full((2 * rows,), 5, dtype=torch.int64)
    idx = torch.arange(rows, dtype=torch.int32)
    out = rejection(logits, drafts, layout, idx, idx.numpy(), np.full(rows, 2), positions,
                    torch.ones(rows, dtype=torch.bool))
    assert 0 < int(out.num_accepted.sum()) < rows  # some drafts pass, some fail
    return out.tokens[:, 0].numpy()


def test_point_mass_drafts_keep_the_target_distribution():
    temperature = 1.3
    target = torch.softmax(TARGET_LOGITS / temperature, 0).double().numpy()
    tokens = _first_tokens_point_mass(temperature)
    assert _chi2(tokens, target) < CHI2_CRITICAL
    # The test has the power to see a 5% distortion.
    assert _chi2(tokens, _distorted(target)) > CHI2_CRITICAL


def test_draft_distribution_drafts_keep_the_target_distribution():
    """The general rule (a draft model's q): accept with min(1, p/q), else a
    draw from norm(max(0, p - q))."""
    rows = DRAWS
    target = torch.softmax(TARGET_LOGITS, 0)
    gen = torch.Generator().manual_seed(1)
    drafts = torch.multinomial(DRAFT_PROBS, rows, replacement=True, generator=gen)
    tokens, accept = accept_with_probs(
        target.repeat(rows, 1), DRAFT_PROBS.repeat(rows, 1), drafts,
        torch.ones(rows, dtype=torch.bool), torch.arange(rows), torch.full((rows,), 9))
    assert 0 < int(accept.sum()) < rows
    p = target.double().numpy()
    assert _chi2(tokens.numpy(), p) < CHI2_CRITICAL
    assert _chi2(tokens.numpy(), _distorted(p)) > CHI2_CRITICAL
    # A sampler that forgets the residual (resamples from p on rejection) is biased.
    wrong = torch.where(accept, drafts, torch.multinomial(target, rows, replacement=True,
                                                          generator=gen))
    assert _chi2(wrong.numpy(), p) > CHI2_CRITICAL


def test_greedy_accepts_while_the_draft_is_the_argmax():
    """Three rows of 1 + 3 logits rows: drafts right, wrong at the second,
    wrong at the first; emitted = accepted drafts + the argmax after them."""
    argmax = [[3, 1, 4, 1], [5, 9, 2, 6], [5, 3, 5, 8]]
    drafts = [[3, 1, 4], [5, 7, 2], [0, 3, 5]]
    logits = torch.full((12, 10), -5.0)
    for r, row in enumerate(argmax):
        for j, t in enumerate(row):
            logits[4 * r + j, t] = 5.0
    flat_drafts = torch.tensor([d for row in drafts for d in row + [0]])
    sampler = _sampler(3, 0.0, seed=0)
    layout = DraftLayout.build(torch.tensor([0, 4, 8, 12], dtype=torch.int32), 3, 12, 4)
    idx = torch.arange(3, dtype=torch.int32)
    out = RejectionSampler(sampler, 3)(logits, flat_drafts, layout, idx, idx.numpy(),
                                       np.full(3, 4), torch.arange(12),
                                       torch.ones(3, dtype=torch.bool))
    assert out.num_accepted.tolist() == [3, 1, 0]
    emitted = [out.tokens[i, : a + 1].tolist() for i, a in enumerate(out.num_accepted.tolist())]
    assert emitted == [[3, 1, 4, 1], [5, 9], [5]]
    assert out.last.tolist() == [1, 9, 5]


def test_penalties_count_the_drafts_before_each_position():
    """With a frequency penalty, logits row j of a request sees its drafts
    0 .. j-1 as outputs: exactly as a one-token step would after accepting them."""
    sampler = Sampler(1, VOCAB, torch.device("cpu"), seed=0)
    sampler.add_request(0, SamplingOptions(temperature=0.0, frequency_penalty=3.0), 1, 1)
    write_added_requests(sampler, torch.zeros(1, 4, dtype=torch.int32))
    logits = torch.tensor([[0.0, 2.0, 1.0, 0, 0, 0, 0, 0]]).repeat(3, 1)
    layout = DraftLayout.build(torch.tensor([0, 3], dtype=torch.int32), 1, 3, 3)
    idx = torch.zeros(1, dtype=torch.int32)
    # Draft 1 then 1: after one 1 the argmax is 2 (2 - 3 < 1), so the second draft fails.
    out = RejectionSampler(sampler, 2)(logits, torch.tensor([1, 1, 0]), layout, idx,
                                       idx.numpy(), np.array([3]), torch.arange(3),
                                       torch.ones(1, dtype=torch.bool))
    assert out.num_accepted.tolist() == [1]
    assert out.tokens[0, :2].tolist() == [1, 2]
    # Both emitted tokens now count: token 1 once, token 2 once.
    assert sampler.penalties.output_counts[0, :3].tolist() == [0, 1, 1]


@pytest.mark.parametrize("num_rows", [1, 5])
def test_layout_of_rows_with_and_without_drafts(num_rows):
    counts = [1 + (i % 3) for i in range(num_rows)]
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    layout = DraftLayout.build(torch.from_numpy(cu), num_rows, int(cu[-1]), 3)
    has = [j < c - 1 for c in counts for j in range(c)]
    assert layout.has_draft.tolist() == has
    assert layout.valid.sum(1).tolist() == counts
