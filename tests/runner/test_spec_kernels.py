"""Speculative decoding's device kernels: combine_draft_tokens and the n-gram
proposer, Triton (compiled on CUDA, else interpreted) and torch reference,
each against a plain-Python oracle written from the docstrings' rules."""

from __future__ import annotations

import random

import pytest
import torch

from runner.ops import torch_ops, triton_ops
from tests.helpers.kernel_device import KERNEL_DEVICE

POISON = -777
OPS = {"ref": torch_ops(torch.device("cpu")), "triton": triton_ops(KERNEL_DEVICE)}


def _device(name: str) -> torch.device:
    return torch.device("cpu") if name == "ref" else KERNEL_DEVICE


# ---- combine_draft_tokens ------------------------------------------------

def _combine_oracle(input_ids, slots, last, drafts, query_lens, computed, prefill, with_drafts):
    """Row by row: logits rows (all tokens of a row with drafts, else the
    last), and the decode rows' input tokens (last sampled, then drafts)."""
    input_ids, logits = list(input_ids), []
    start = 0
    for i, (slot, n) in enumerate(zip(slots, query_lens)):
        m = n if with_drafts[i] else 1
        logits += [start + n - m + j for j in range(m)]
        if computed[slot] >= prefill[slot]:
            input_ids[start] = last[slot]
            for j in range(n - 1):
                input_ids[start + 1 + j] = drafts[slot][j]
        start += n
    return input_ids, logits


def _random_combine_case(rng: random.Random, k: int):
    num_slots = 9
    prefill = [rng.randint(1, 40) for _ in range(num_slots)]
    computed = [rng.choice([rng.randint(0, p - 1), p + rng.randint(0, 30)]) for p in prefill]
    slots = rng.sample(range(num_slots), rng.randint(1, num_slots))
    query_lens, with_drafts = [], []
    for s in slots:
        if computed[s] >= prefill[s]:
            n = rng.randint(1, 1 + k)
        else:
            n = rng.randint(1, prefill[s] - computed[s])
        query_lens.append(n)
        with_drafts.append(computed[s] >= prefill[s] and n > 1)
    last = [rng.randint(0, 999) for _ in range(num_slots)]
    drafts = [[rng.randint(0, 999) for _ in range(k)] for _ in range(num_slots)]
    return prefill, computed, slots, query_lens, with_drafts, last, drafts


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_combine_draft_tokens_matches_the_oracle(impl):
    rng = random.Random(3)
    ops, device = OPS[impl], _device(impl)
    for _ in range(25):
        k = rng.randint(1, 5)
        prefill, computed, slots, qlens, with_drafts, last, drafts = _random_combine_case(rng, k)
        num_reqs, total = len(slots), sum(qlens)
        qsl = [0]
        for n in qlens:
            qsl.append(qsl[-1] + n)
        cu = [0]
        for n, d in zip(qlens, with_drafts):
            cu.append(cu[-1] + (n if d else 1))
        padded = num_reqs + 2  # padded rows repeat the totals
        t = lambda x, dt=torch.int32: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
        input_ids = t([POISON] * (total + 5))
        logits_out = t([POISON] * (total + 5), torch.int64)
        seq_lens = t([computed[s] + n for s, n in zip(slots, qlens)] + [0] * 2)
        ops.combine_draft_tokens(
            input_ids, t(slots + [0] * 2), t(last, torch.int64), t(drafts, torch.int64),
            t(qsl + [total] * 2), t(cu + [cu[-1]] * 2), seq_lens, t(prefill), logits_out,
            num_reqs)
        want_ids, want_logits = _combine_oracle([POISON] * (total + 5), slots, last, drafts,
                                                qlens, computed, prefill, with_drafts)
        assert input_ids.tolist() == want_ids
        assert logits_out[: cu[-1]].tolist() == want_logits
        assert logits_out[cu[-1]:].tolist() == [POISON] * (total + 5 - cu[-1])
        assert padded == num_reqs + 2


# ---- the n-gram proposer -------------------------------------------------

def _ngram_oracle(history: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The docstring's rule, in plain Python."""
    h = len(history)
    for n in range(hi, lo - 1, -1):
        if h < n:
            continue
        suffix = history[h - n:]
        for e in range(h - 2, n - 2, -1):
            if history[e - n + 1: e + 1] == suffix:
                period = h - 1 - e
                return [history[e + 1 + j % period] for j in range(k)]
    return [history[-1]] * k


def test_ngram_oracle_on_hand_worked_cases():
    # "5 6" last occurred at 6..7 -> the three tokens after it.
    assert _ngram_oracle([5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 3, 5, 6], 3, 1, 3) == [7, 1, 2]
    # A repeat of period 2 continues past the end of the history.
    assert _ngram_oracle([1, 2, 1, 2, 1], 4, 1, 3) == [2, 1, 2, 1]
    # No match: the last token, k times.
    assert _ngram_oracle([1, 2, 3, 4], 2, 1, 3) == [4, 4]
    # The longest n-gram wins over a later shorter match.
    assert _ngram_oracle([1, 2, 3, 9, 3, 8, 2, 3], 1, 1, 2) == [9]


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_ngram_propose_matches_the_oracle(impl):
    rng = random.Random(11)
    ops, device = OPS[impl], _device(impl)
    width, num_slots = 200, 7
    for _ in range(12):
        k = rng.randint(1, 6)
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        vocab = rng.choice([2, 3, 5, 50])
        table = [[rng.randrange(vocab) for _ in range(width)] for _ in range(num_slots)]
        computed = [rng.choice([0, 1, 2, rng.randint(3, width - 1), width - 1])
                    for _ in range(num_slots)]
        slots = rng.sample(range(num_slots), rng.randint(1, num_slots))
        drafts = torch.full((num_slots, k), POISON, dtype=torch.int64, device=device)
        ops.ngram_propose(torch.tensor(table, dtype=torch.int32, device=device),
                          torch.tensor(slots, dtype=torch.int32, device=device),
                          torch.tensor(computed, dtype=torch.int32, device=device), drafts,
                          len(slots), lo, hi)
        for s in range(num_slots):
            want = (_ngram_oracle(table[s][: computed[s] + 1], k, lo, hi) if s in slots
                    else [POISON] * k)
            assert drafts[s].tolist() == want, (s, computed[s], lo, hi)


def test_ngram_propose_refuses_bad_bounds():
    with pytest.raises(ValueError, match="min_n"):
        OPS["ref"].ngram_propose(torch.zeros(2, 8, dtype=torch.int32),
                                 torch.zeros(1, dtype=torch.int32),
                                 torch.zeros(2, dtype=torch.int32),
                                 torch.zeros(2, 3, dtype=torch.int64), 1, 3, 2)
