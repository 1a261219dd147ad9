"""The sampler against independent references (numpy / plain torch / pure Python).

Covers: the noise hash, the sampled distribution (chi-square), min-p / top-k /
top-p sets, seeded reproducibility across batches, penalties and their
output counts, raw logprobs through AsyncOutput, greedy rows, no host sync on
CUDA, and end to end through ``engine.LLM``.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from ipc.messages import SamplingOptions
from runner.async_output import AsyncOutput
from runner.ops import triton_ops
from runner.sampler import Sampler
from runner.sampling.filters import apply_min_p, apply_top_k_top_p
from runner.sampling.noise import (
    ROW_MUL,
    TOKEN_MUL,
    gumbel_argmax_ref,
    mix_int,
    token_keys,
    uniform_noise,
)
from runner.sampling.triton_noise import greedy_argmax_triton, gumbel_argmax_triton
from runner.transfer import HostTransfer, PinnedTransfer
from tests.helpers.kernel_device import KERNEL_DEVICE
from tests.helpers.sampler_writes import write_added_requests
from tests.helpers.sampling_reference import reference_allowed, reference_distribution

CPU = torch.device("cpu")
TRITON_DEVICE = KERNEL_DEVICE
MAX_LEN = 64


# ---- helpers ----------------------------------------------------------------

def make_sampler(requests, vocab, max_reqs=16, seed=0, device=CPU):
    """requests: {slot: (SamplingOptions, prompt, earlier_outputs)}."""
    sampler = Sampler(max_reqs, vocab, device, seed)
    table = torch.zeros(max_reqs, MAX_LEN, dtype=torch.int32)
    for slot, (options, prompt, outputs) in requests.items():
        tokens = list(prompt) + list(outputs)
        table[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        sampler.add_request(slot, options, len(prompt), len(tokens))
    write_added_requests(sampler, table.to(device))
    return sampler


def run(sampler, logits, slots, positions, mask=None):
    device = sampler.token_keys.device
    idx_np = np.asarray(slots, dtype=np.int32)
    mask = np.ones(len(slots), dtype=bool) if mask is None else np.asarray(mask)
    return sampler(
        logits.to(device),
        torch.from_numpy(idx_np).to(device),
        idx_np,
        torch.as_tensor(positions, dtype=torch.int64).to(device),
        torch.from_numpy(mask).to(device),
    )


def opts(**kw):
    return SamplingOptions(**kw)


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): closed forms for integer df."""
    h = x / 2
    if df % 2 == 0:
        return math.exp(-h) * sum(h**i / math.factorial(i) for i in range(df // 2))
    tail = sum(h ** (i - 0.5) / math.gamma(i + 0.5) for i in range(1, df // 2 + 1))
    return math.erfc(math.sqrt(h)) + math.exp(-h) * tail


def chi2_pvalue(tokens: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's test of draws against probs (cells with probability 0 must be empty)."""
    counts = np.bincount(tokens, minlength=len(probs)).astype(np.float64)
    support = probs > 0
    assert counts[~support].sum() == 0, "a token of probability 0 was drawn"
    expected = probs[support] * len(tokens)
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    return chi2_sf(stat, int(support.sum()) - 1)


# ---- the noise hash ---------------------------------------------------------

def test_noise_matches_pure_python_hash():
    seeds = torch.tensor([0, 1, 12345, 2**62 + 17, 2**63 - 1])
    positions = torch.tensor([0, 7, 4095, 1, 123456])
    vocab = 37
    got = uniform_noise(seeds, positions, token_keys(vocab, CPU))
    for i, (s, p) in enumerate(zip(seeds.tolist(), positions.tolist())):
        row = mix_int(mix_int(s) + p * ROW_MUL)
        for t in range(vocab):
            bits = mix_int(row ^ mix_int((t + 1) * TOKEN_MUL))
            assert got[i, t].item() == ((bits >> 41) + 0.5) / 2**23
    assert 0 < got.min() and got.max() < 1


def _composed_draw(logits, slots, temperature, seeds, positions, threshold):
    """The draw spelled out row by row from the hash: argmax of the row
    where its slot's temperature is 0, else argmax of row / t +
    -log(-log(u)) with u the row's uniforms, its logits below
    ``threshold[i]`` (if given) at -inf first."""
    out = []
    for i, slot in enumerate(slots.tolist()):
        row = logits[i].to(torch.float32)
        t = float(temperature[slot])
        if t == 0.0:
            out.append(int(row.argmax()))
            continue
        if threshold is not None:
            row = torch.where(row < threshold[i], float("-inf"), row)
        row = torch.where(row == float("-inf"), row, row / t)  # -inf / inf would be NaN
        u = uniform_noise(seeds[slot:slot + 1], positions[i:i + 1], token_keys(len(row), CPU))[0]
        out.append(int((row - torch.log(-torch.log(u))).argmax()))
    return torch.tensor(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("filtered", [False, True])
def test_gumbel_draw_reads_each_rows_temperature_and_seed_at_its_slot(dtype, filtered):
    # Rows sit at slots in any order; temperature is a column of a wider
    # table (as the sampler's float table holds it); slot 5 is greedy. With
    # ``filtered`` each row has a threshold (one -inf: keep all; the greedy
    # row's ignored). The torch reference against the row-by-row
    # composition, then the kernel (under the Triton interpreter on CPU)
    # against the reference, tokens and the slots' stored tokens both.
    gen = torch.Generator().manual_seed(4)
    slots = torch.tensor([3, 0, 5, 1, 7, 2, 6, 4])
    table = torch.zeros(9, 6)
    table[:, 0] = torch.tensor([1.0, 0.7, 2.5, 1e-3, 1.0, 0.0, 0.31, float("inf"), 9.0])
    temperature = table[:, 0]
    seeds = torch.tensor([0, 1, 5, 2**62 + 3, 2**63 - 1, 77, 12, 13, 8])
    positions = torch.tensor([0, 1, 2, 3, 100000, 7, 7, 7])
    for vocab in (37, 1500):
        logits = (3 * torch.randn(8, vocab, generator=gen)).to(dtype)
        logits[:, ::3] = float("-inf")
        threshold = None
        if filtered:
            threshold = logits.float().quantile(0.9, dim=-1)
            threshold[0] = float("-inf")
            threshold[2] = logits[2].float().max() + 1  # greedy: ignored
        last = torch.full((9,), -1, dtype=torch.int64)
        want = gumbel_argmax_ref(logits, slots, temperature, seeds, positions,
                                 token_keys(vocab, CPU), threshold, last)
        assert torch.equal(want, _composed_draw(logits, slots, temperature, seeds, positions,
                                                threshold))
        if filtered:
            assert bool((logits.float().gather(1, want[:, None])[:, 0] >= threshold)[3:].all())
        assert want[2] == logits[2].argmax()  # the greedy row
        assert torch.equal(last[slots], want) and last[8] == -1
        dev = TRITON_DEVICE
        last_dev = torch.full((9,), -1, dtype=torch.int64, device=dev)
        got = gumbel_argmax_triton(logits.to(dev), slots.to(dev), table.to(dev)[:, 0],
                                   seeds.to(dev), positions.to(dev), token_keys(vocab, dev),
                                   None if threshold is None else threshold.to(dev),
                                   last_dev).cpu()
        assert torch.equal(got, want)
        assert torch.equal(last_dev.cpu(), last)
        assert bool(torch.isfinite(logits.gather(1, got[:, None])).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [37, 2048, 5000])
def test_triton_greedy_argmax_matches_torch_first_index_on_ties(dtype, vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=gen).to(dtype)
    logits[1, :] = 0.0  # all tied: token 0
    logits[2, ::2] = float("-inf")
    top = logits[3].max()
    logits[3, [vocab - 1, vocab // 2, 5]] = top + 1  # tie across blocks: the first
    logits[4, :] = float("-inf")  # nothing allowed: token 0, as torch says
    got = greedy_argmax_triton(logits.to(TRITON_DEVICE)).cpu()
    want = logits.argmax(dim=-1)
    assert torch.equal(got, want)
    assert got[1] == 0 and got[3] == 5


@pytest.mark.parametrize("vocab", [37, 5000])
def test_triton_greedy_argmax_stores_each_token_at_its_slot(vocab):
    # The draw keeps the runner's last sampled token of each slot itself:
    # slot slots[i] gets row i's argmax, every other slot keeps its value.
    gen = torch.Generator().manual_seed(vocab + 1)
    logits = torch.randn(4, vocab, generator=gen)
    slots = torch.tensor([5, 0, 7, 2], dtype=torch.int64)
    last = torch.full((9,), -3, dtype=torch.int64)
    dev = TRITON_DEVICE
    last_dev = last.to(dev)
    got = greedy_argmax_triton(logits.to(dev), slots.to(dev), last_dev).cpu()
    want = logits.argmax(dim=-1)
    assert torch.equal(got, want)
    expected = last.clone()
    for row, slot in enumerate(slots.tolist()):
        expected[slot] = want[row]
    assert torch.equal(last_dev.cpu(), expected)


@pytest.mark.parametrize("vocab", [37, 5000])
def test_triton_argmax_draws_take_nan_as_the_maximum(vocab):
    # A NaN logit (a broken forward) must still give a token of the
    # vocabulary: the first NaN, as torch.argmax gives it.
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen)
    logits[0, :] = float("nan")  # every token NaN: token 0
    logits[1, vocab - 1] = float("nan")  # one NaN, in the last block
    logits[2, [3, vocab // 2]] = float("nan")  # the first of two
    logits[3, 1:] = float("nan")
    logits[3, 0] = float("-inf")
    want = logits.argmax(dim=-1)
    assert want.tolist()[:4] == [0, vocab - 1, 3, 1]
    dev = TRITON_DEVICE
    assert torch.equal(greedy_argmax_triton(logits.to(dev)).cpu(), want)
    slots, temperature = torch.arange(5), torch.ones(5)
    seeds, positions = torch.arange(5), torch.zeros(5, dtype=torch.int64)
    noisy = gumbel_argmax_triton(logits.to(dev), slots.to(dev), temperature.to(dev),
                                 seeds.to(dev), positions.to(dev), token_keys(vocab, dev)).cpu()
    assert torch.equal(noisy[:4], want[:4])
    assert torch.equal(noisy, gumbel_argmax_ref(logits, slots, temperature, seeds, positions,
                                                 token_keys(vocab, CPU)))


def test_chi2_helper_known_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-6)
    assert chi2_sf(5.991464547107979, 2) == pytest.approx(0.05, rel=1e-6)
    assert chi2_sf(11.070497693516351, 5) == pytest.approx(0.05, rel=1e-6)
    assert chi2_sf(23.209251158954356, 10) == pytest.approx(0.01, rel=1e-6)


# ---- the sampled distribution -------------------------------------------------

def _many_draws(options, row, num_draws=20_000, num_slots=8):
    """num_draws draws of one logits row by num_slots seeded requests at many positions."""
    requests = {s: (opts(seed=1000 + s, **options), [1], []) for s in range(num_slots)}
    sampler = make_sampler(requests, len(row))
    slots = np.arange(num_draws) % num_slots
    positions = 5 + np.arange(num_draws) // num_slots
    logits = torch.from_numpy(row).float().expand(num_draws, -1)
    return run(sampler, logits, slots, positions).sampled_token_ids.numpy()


ROW9 = np.array([1.0, 0.2, -0.5, 2.0, 0.0, -1.5, 0.7, 1.2, -0.3], dtype=np.float32)


@pytest.mark.parametrize(
    "options",
    [
        dict(temperature=1.0),
        dict(temperature=0.7),
        dict(temperature=1.8, top_k=4),
        dict(temperature=1.0, top_p=0.8),
        dict(temperature=1.3, min_p=0.15),
        dict(temperature=0.9, top_k=6, top_p=0.9, min_p=0.05),
    ],
)
def test_draws_follow_the_filtered_softmax(options):
    tokens = _many_draws(options, ROW9)
    temperature = options["temperature"]
    filters = {k: v for k, v in options.items() if k != "temperature"}
    probs = reference_distribution(ROW9, temperature, **filters)
    assert chi2_pvalue(tokens, probs) > 1e-6


@pytest.mark.parametrize("filters", [{}, dict(top_p=0.5)])
def test_an_infinite_temperature_draws_uniformly_among_the_allowed_tokens(filters):
    # A temperature beyond float32 is stored as inf: every finite logit
    # scales to 0, so the draw is uniform over them; a token at -inf (masked
    # before the sampler) must stay out (-inf / inf would be NaN). With
    # top-p 0.5 the uniform row keeps its least values too: ties stay.
    row = np.full(9, -np.inf, dtype=np.float32)
    row[[1, 4, 6]] = [3.0, -2.0, 0.5]
    tokens = _many_draws(dict(temperature=1e39, **filters), row, num_draws=3000)
    assert set(tokens.tolist()) <= {1, 4, 6}
    probs = np.where(np.isfinite(row), 1 / 3, 0.0)
    assert chi2_pvalue(tokens, probs) > 1e-6


def test_chi_square_rejects_the_wrong_temperature():
    tokens = _many_draws(dict(temperature=0.7), ROW9)
    assert chi2_pvalue(tokens, reference_distribution(ROW9, 1.0)) < 1e-6


# ---- min-p, top-k, top-p ------------------------------------------------------

def test_filters_keep_exactly_the_reference_set():
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(64, 100, generator=gen)
    top_k = torch.randint(0, 30, (64,), generator=gen)
    top_p = torch.rand(64, generator=gen) * 0.9 + 0.1
    top_p[::5] = 1.0
    min_p = torch.rand(64, generator=gen) * 0.3
    min_p[::3] = 0.0
    out = apply_top_k_top_p(apply_min_p(logits, min_p), top_k, top_p, int(top_k.max()), True)
    for i in range(64):
        want = reference_allowed(logits[i].numpy(), 1.0, int(top_k[i]), float(top_p[i]),
                                 float(min_p[i]))
        assert np.array_equal(torch.isfinite(out[i]).numpy(), want), i
        assert torch.equal(out[i][torch.isfinite(out[i])], logits[i][torch.from_numpy(want)])


def test_top_k_without_top_p_uses_the_same_set():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 50, generator=gen)
    top_k = torch.tensor([0, 1, 2, 5, 49, 50, 80, 7] * 2)
    top_p = torch.ones(16)
    fast = apply_top_k_top_p(logits, top_k, top_p, int(top_k.max()), any_top_p=False)
    full = apply_top_k_top_p(logits, top_k, top_p, int(top_k.max()), any_top_p=True)
    assert torch.equal(fast, full)
    assert torch.isfinite(fast).sum(-1).tolist() == [50, 1, 2, 5, 49, 50, 50, 7] * 2


MIXED = {
    0: dict(temperature=1.0, top_k=5),
    1: dict(temperature=0.7, top_p=0.6),
    2: dict(temperature=1.3, min_p=0.2),
    3: dict(temperature=0.9, top_k=8, top_p=0.8, min_p=0.05),
    4: dict(temperature=2.0, top_k=3, top_p=0.5),
    5: dict(temperature=1.0),  # unfiltered: must leave the top-5 set now and then
}


@pytest.mark.parametrize("seed", range(6))
def test_filtered_rows_never_leave_their_allowed_set(seed):
    vocab, rounds = 64, 150
    requests = {s: (opts(seed=seed * 100 + s, **o), [1], []) for s, o in MIXED.items()}
    sampler = make_sampler(requests, vocab, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    slots = np.tile(np.array(list(MIXED)), rounds)
    rng = np.random.default_rng(seed)
    rng.shuffle(slots)  # the rows of a slot sit anywhere in the batch
    logits = 2.5 * torch.randn(len(slots), vocab, generator=gen)
    positions = np.arange(len(slots)) + 3
    tokens = run(sampler, logits, slots, positions).sampled_token_ids.numpy()
    seen: dict[int, set] = {s: set() for s in MIXED}
    outside_top5 = 0
    for i, slot in enumerate(slots):
        o = MIXED[slot]
        filters = {k: v for k, v in o.items() if k != "temperature"}
        allowed = reference_allowed(logits[i].numpy(), o["temperature"], slack=1e-4, **filters)
        top5 = reference_allowed(logits[i].numpy(), 1.0, top_k=5)
        seen[slot].add(int(tokens[i]))
        if slot == 5:
            outside_top5 += not top5[tokens[i]]
        else:
            assert allowed[tokens[i]], (slot, i)
    assert all(len(s) > 3 for s in seen.values())  # real sampling, not a constant
    assert outside_top5 > 0


# ---- seeds --------------------------------------------------------------------

def test_seeded_request_draws_the_same_alone_and_in_any_batch():
    vocab, steps = 40, 30
    target = opts(temperature=0.9, top_k=12, top_p=0.85, seed=4242)
    gen = torch.Generator().manual_seed(7)
    rows = 2 * torch.randn(steps, vocab, generator=gen)
    alone = make_sampler({3: (target, [1], [])}, vocab, seed=0)
    want = run(alone, rows, [3] * steps, range(10, 10 + steps)).sampled_token_ids

    others = {
        0: (opts(temperature=0.0), [2, 3], []),
        1: (opts(temperature=1.5, min_p=0.1, seed=1), [4], []),
        2: (opts(temperature=0.6, repetition_penalty=1.4, presence_penalty=0.5), [5, 6], []),
        9: (target, [1], []),  # same request options, another slot
    }
    crowded = make_sampler(others, vocab, seed=99)  # another runner seed
    assert len(set(want.tolist())) > 3
    for step in range(steps):
        slots = [0, 2, 9, 1] if step % 2 else [9, 1, 0, 2]
        row = slots.index(9)
        logits = 2 * torch.randn(4, vocab, generator=gen)
        logits[row] = rows[step]
        positions = [3 + step] * 4
        positions[row] = 10 + step
        got = run(crowded, logits, slots, positions).sampled_token_ids[row]
        assert got == want[step], step


def test_seeded_rows_depend_on_seed_and_position_only():
    vocab = 40
    target = opts(temperature=1.0, seed=77)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(1, vocab, generator=gen).expand(64, -1).contiguous()
    sampler = make_sampler({1: (target, [1], []), 6: (target, [1], [])}, vocab)
    a = run(sampler, logits, [1] * 32 + [6] * 32, list(range(32)) * 2).sampled_token_ids
    assert torch.equal(a[:32], a[32:])  # same seed and positions, other slot
    assert len(set(a[:32].tolist())) > 5  # positions give fresh draws
    other = make_sampler({1: (opts(temperature=1.0, seed=78), [1], [])}, vocab)
    b = run(other, logits[:32], [1] * 32, range(32)).sampled_token_ids
    assert not torch.equal(a[:32], b)


def test_seeds_span_the_signed_64_bit_range_one_key_each():
    """Seeds are any signed 64-bit int (``SamplingParams``' range). A seed
    and the seed 2**63 below it share their low 63 bits; each is its own
    key: the draw of row i is the argmax of the uniform logits' noise,
    which the pure-Python hash of the seed's 64 bits gives, and the kernel
    draws what the reference draws."""
    vocab, steps = 64, 24
    pairs = [(77, 77 - 2**63), (2**63 - 1, -1), (0, -(2**63))]
    requests = {slot: (opts(temperature=1.0, seed=seed), [1], [])
                for slot, seed in enumerate(s for pair in pairs for s in pair)}
    sampler = make_sampler(requests, vocab)
    logits = torch.zeros(steps, vocab)  # every token as likely: the noise decides
    draws = {}
    for slot, (options, _, _) in requests.items():
        draws[options.seed] = run(sampler, logits, [slot] * steps,
                                  range(steps)).sampled_token_ids.tolist()
        for position in (0, steps - 1):
            row = mix_int(mix_int(options.seed) + position * ROW_MUL)
            bits = [mix_int(row ^ mix_int((t + 1) * TOKEN_MUL)) >> 41 for t in range(vocab)]
            assert draws[options.seed][position] == bits.index(max(bits))
    for high, low in pairs:
        assert draws[high] != draws[low], (high, low)
    seeds = torch.tensor([seed for pair in pairs for seed in pair])
    slots, positions = torch.arange(len(seeds)), torch.full((len(seeds),), 5)
    temperature = torch.ones(len(seeds))
    want = gumbel_argmax_ref(logits[:len(seeds)], slots, temperature, seeds, positions,
                             token_keys(vocab, CPU))
    dev = TRITON_DEVICE
    got = gumbel_argmax_triton(logits[:len(seeds)].to(dev), slots.to(dev), temperature.to(dev),
                               seeds.to(dev), positions.to(dev), token_keys(vocab, dev)).cpu()
    assert torch.equal(got, want)
    assert want.tolist() == [draws[int(s)][5] for s in seeds]


def test_unseeded_requests_take_the_runner_seed():
    vocab = 40
    logits = torch.zeros(64, vocab)
    draws = []
    for runner_seed in (0, 0, 1):
        sampler = make_sampler({2: (opts(temperature=1.0), [1], [])}, vocab, seed=runner_seed)
        draws.append(run(sampler, logits, [2] * 64, range(64)).sampled_token_ids)
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2])


# ---- greedy -------------------------------------------------------------------

def test_greedy_rows_in_a_mixed_batch_are_the_argmax():
    vocab = 80
    requests = {
        0: (opts(temperature=0.0), [1], []),
        1: (opts(temperature=0.0, top_k=2, top_p=0.1, min_p=0.9), [1], []),  # ignored
        2: (opts(temperature=1e-6), [1], []),  # below the runner's epsilon: greedy
        3: (opts(temperature=1.2, top_k=10, seed=5), [1], []),
        4: (opts(temperature=0.8, top_p=0.5), [1], []),
    }
    sampler = make_sampler(requests, vocab)
    gen = torch.Generator().manual_seed(11)
    slots = [3, 0, 4, 1, 2] * 40
    logits = 3 * torch.randn(len(slots), vocab, generator=gen)
    tokens = run(sampler, logits, slots, range(len(slots))).sampled_token_ids
    greedy = [i for i, s in enumerate(slots) if s in (0, 1, 2)]
    assert torch.equal(tokens[greedy], logits[greedy].argmax(-1))
    sampled = [i for i, s in enumerate(slots) if s in (3, 4)]
    assert not torch.equal(tokens[sampled], logits[sampled].argmax(-1))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_sampled_tokens_reach_last_tokens_at_their_slots(temperature):
    # Greedy batches take the argmax's own store, others a copy after the
    # draw; both leave each row's token at its slot and other slots alone.
    vocab = 50
    requests = {s: (opts(temperature=temperature, seed=s), [1], []) for s in (1, 3, 6)}
    sampler = make_sampler(requests, vocab)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, vocab, generator=gen)
    slots = [6, 1, 3]
    last = torch.full((16,), 99, dtype=torch.int64)
    idx_np = np.asarray(slots, dtype=np.int32)
    out = sampler(logits, torch.from_numpy(idx_np), idx_np, torch.arange(3),
                  torch.ones(3, dtype=torch.bool), last_tokens=last)
    tokens = out.sampled_token_ids
    if temperature == 0.0:
        assert torch.equal(tokens, logits.argmax(-1))
    expected = torch.full((16,), 99, dtype=torch.int64)
    expected[slots] = tokens
    assert torch.equal(last, expected)


def test_extreme_filters_are_honoured_not_fatal():
    """top_p that rounds to 0 in float32 keeps the largest value (the argmax);
    a top_k beyond the vocabulary, even beyond int32, filters nothing; a
    logprobs count beyond the vocabulary returns the whole vocabulary."""
    vocab = 60
    requests = {
        0: (opts(temperature=1.0, top_p=1e-50, seed=3), [1], []),
        1: (opts(temperature=1.0, top_k=2**40, seed=4, logprobs=2**40), [1], []),
        2: (opts(temperature=1.0, top_k=0, seed=4), [1], []),
    }
    sampler = make_sampler(requests, vocab)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, vocab, generator=gen)
    out = run(sampler, logits, [0, 1, 2], [7, 7, 7])
    assert out.sampled_token_ids[0] == logits[0].argmax()
    # Same seed and position, same logits: the unfiltered draw.
    sampler_same = make_sampler({1: requests[2]}, vocab)
    plain = run(sampler_same, logits[1:2], [1], [7]).sampled_token_ids
    assert out.sampled_token_ids[1] == plain[0]
    assert out.logprobs.top_logprobs.shape[-1] == vocab


# ---- penalties ----------------------------------------------------------------

def reference_penalties(row, prompt, outputs, rep, pres, freq):
    """vLLM's definitions, token by token, in float64."""
    out = row.double().clone()
    counts = Counter(outputs)
    for t in range(len(out)):
        if t in prompt or counts[t] > 0:
            out[t] = out[t] / rep if out[t] > 0 else out[t] * rep
        out[t] -= freq * counts[t] + pres * (counts[t] > 0)
    return out


PENALISED = {
    0: (dict(repetition_penalty=1.8), [3, 4, 5, 3], [7, 7]),
    1: (dict(presence_penalty=1.5, frequency_penalty=0.7), [3, 8], [9]),
    2: (dict(repetition_penalty=0.6, presence_penalty=-0.5, frequency_penalty=1.1), [1, 2], []),
    3: (dict(), [3, 4], [5]),  # no penalty: plain argmax
}


def test_penalties_and_output_counts_follow_the_reference():
    vocab, steps = 24, 8
    requests = {s: (opts(temperature=0.0, **o), p, out) for s, (o, p, out) in PENALISED.items()}
    sampler = make_sampler(requests, vocab)
    outputs = {s: list(out) for s, (_, _, out) in PENALISED.items()}
    gen = torch.Generator().manual_seed(5)
    slots = [2, 0, 3, 1]
    changed = 0
    for step in range(steps):
        logits = torch.randn(4, vocab, generator=gen)
        logits[:, [3, 4, 7, 9]] += 2.0  # prompt / earlier tokens lead: penalties matter
        mask = [True, step != 2, True, step % 3 != 1]
        tokens = run(sampler, logits, slots, [20 + step] * 4, mask).sampled_token_ids
        for i, slot in enumerate(slots):
            o, prompt, _ = PENALISED[slot]
            want = reference_penalties(logits[i], set(prompt), outputs[slot],
                                       o.get("repetition_penalty", 1.0),
                                       o.get("presence_penalty", 0.0),
                                       o.get("frequency_penalty", 0.0))
            assert tokens[i] == want.argmax(), (step, slot)
            changed += int(want.argmax() != logits[i].argmax())
            if mask[i]:
                outputs[slot].append(int(tokens[i]))
    assert changed > 0
    for slot in (0, 1, 2):  # slot 3 uses no penalty: its counts are not kept
        counts = np.bincount(outputs[slot], minlength=vocab)
        assert np.array_equal(sampler.penalties.output_counts[slot].numpy(), counts), slot


def test_penalised_logits_match_the_reference_values():
    vocab = 30
    requests = {s: (opts(temperature=0.0, **o), p, out) for s, (o, p, out) in PENALISED.items()}
    sampler = make_sampler(requests, vocab)
    gen = torch.Generator().manual_seed(8)
    logits = 3 * torch.randn(4, vocab, generator=gen)
    slots = torch.tensor([0, 1, 2, 3])
    got = sampler.penalties.apply(logits, slots, sampler.states.slot_penalties)
    for i in range(4):
        o, prompt, out = PENALISED[i]
        want = reference_penalties(logits[i], set(prompt), out,
                                   o.get("repetition_penalty", 1.0),
                                   o.get("presence_penalty", 0.0),
                                   o.get("frequency_penalty", 0.0))
        torch.testing.assert_close(got[i].double(), want, rtol=1e-6, atol=1e-6)
    mask = sampler.penalties.prompt_mask
    assert mask[0].nonzero().flatten().tolist() == [3, 4, 5]  # prompt only, not outputs


def test_reused_slot_starts_with_clean_penalty_rows():
    vocab = 16
    sampler = make_sampler({4: (opts(presence_penalty=1.0), [1, 2], [3, 3])}, vocab)
    table = torch.zeros(16, MAX_LEN, dtype=torch.int32)
    table[4, :2] = torch.tensor([9, 10])
    sampler.add_request(4, opts(frequency_penalty=0.5), 1, 2)  # prompt [9], earlier [10]
    write_added_requests(sampler, table)
    assert sampler.penalties.prompt_mask[4].nonzero().flatten().tolist() == [9]
    assert sampler.penalties.output_counts[4].nonzero().flatten().tolist() == [10]


def test_out_of_range_options_are_named_by_their_one_check():
    """``SamplingOptions.problems``: what the engine refuses a request for
    and ``plan_check`` a plan for (the sampler itself checks nothing)."""
    for bad, name in ((opts(top_p=0.0), "top_p"), (opts(temperature=-1.0), "temperature"),
                      (opts(min_p=1.5), "min_p"), (opts(repetition_penalty=0.0),
                                                   "repetition_penalty"),
                      (opts(logprobs=-2), "logprobs"), (opts(top_k=-1), "top_k"),
                      (opts(presence_penalty=2.5), "presence_penalty"),
                      (opts(temperature=float("nan")), "temperature")):
        assert [p.split()[0] for p in bad.problems()] == [name]
    assert opts(temperature=0.0, top_p=1.0, min_p=1.0, logprobs=0).problems() == []


# ---- logprobs -----------------------------------------------------------------

LOGPROB_REQS = {
    0: dict(temperature=0.0, logprobs=3),
    1: dict(temperature=1.5, seed=2),  # no logprobs
    2: dict(temperature=2.0, logprobs=0, repetition_penalty=2.0, seed=3),
    3: dict(temperature=1.0, logprobs=5, top_k=20, seed=4),
    4: dict(temperature=3.0, logprobs=2, seed=5),
}


def _logprob_step(vocab=50, mask=(True, True, False, True, True, True)):
    requests = {s: (opts(**o), [1, 2], []) for s, o in LOGPROB_REQS.items()}
    sampler = make_sampler(requests, vocab)
    gen = torch.Generator().manual_seed(21)
    slots = [4, 0, 2, 1, 3, 2]
    logits = 2 * torch.randn(len(slots), vocab, generator=gen)
    out = run(sampler, logits, slots, [9, 3, 4, 5, 6, 7], list(mask))
    reply = AsyncOutput(11, PLAN_ORDER, np.array(mask), out, HostTransfer(CPU)).get_output()
    return slots, logits, reply


# Batch row i answers the PLAN_ORDER[i]-th request of the plan; the reply
# lists rows in plan order, so batch row of plan row p is BATCH_ROW[p].
PLAN_ORDER = np.array([2, 0, 5, 1, 4, 3])
BATCH_ROW = np.argsort(PLAN_ORDER)


def _sampled_batch_rows(reply) -> list[int]:
    """Batch rows of the reply's logprob rows, in reply order."""
    return [int(BATCH_ROW[p]) for p, row in enumerate(reply.rows()) if row]


def test_reply_is_in_plan_order_and_skips_unsampled_rows():
    _, _, reply = _logprob_step()
    rows = reply.rows()
    assert [len(r) for r in rows] == [1, 1, 1, 1, 1, 0]  # batch row 2 is plan row 5
    assert reply.num_sampled == [1, 1, 1, 1, 1, 0]


@pytest.mark.parametrize("mixed", [False, True])
def test_model_dtype_logits_draw_what_their_float32_values_draw(mixed):
    # The runner hands the sampler logits in the model's dtype; the values
    # are the same in float32, so every draw (the greedy fast path's argmax,
    # the filtered Gumbel draws, the logprobs) must be too.
    vocab = 300
    requests = {0: (opts(temperature=0.0), [1], [])}
    if mixed:
        requests[1] = (opts(temperature=0.9, top_k=40, seed=3, logprobs=2), [1], [])
    gen = torch.Generator().manual_seed(5)
    slots = [0, 1, 0, 1] * 8 if mixed else [0] * 32
    logits = (3 * torch.randn(len(slots), vocab, generator=gen)).to(torch.bfloat16)
    logits[0, :] = 0.0  # a tie: the first token
    got = run(make_sampler(requests, vocab), logits, slots, range(len(slots)))
    want = run(make_sampler(requests, vocab), logits.float(), slots, range(len(slots)))
    assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
    assert got.sampled_token_ids[0] == 0
    if mixed:
        for a, b in zip(got.logprobs.tensors(), want.logprobs.tensors(), strict=True):
            assert torch.equal(a, b)


def test_logprobs_are_raw_and_follow_the_sampled_rows():
    slots, logits, reply = _logprob_step()
    lp = reply.logprobs
    rows = _sampled_batch_rows(reply)
    tokens = [row[0] for row in reply.rows() if row]
    assert len(lp.sampled_logprobs) == len(rows) == 5
    ranks = []
    for j, i in enumerate(rows):
        want = torch.log_softmax(logits[i].double(), dim=-1)
        asked = LOGPROB_REQS[slots[i]].get("logprobs") or 0
        order = torch.argsort(want, descending=True)[:asked]
        assert lp.top_token_ids[j] == order.tolist()
        np.testing.assert_allclose(lp.top_logprobs[j], want[order].numpy(), atol=1e-5)
        token = tokens[j]
        assert lp.sampled_logprobs[j] == pytest.approx(want[token].item(), abs=1e-5)
        assert lp.sampled_ranks[j] == 1 + int((logits[i] > logits[i, token]).sum())
        ranks.append(lp.sampled_ranks[j])
    assert max(ranks) > 1  # sampled rows do not always take the most likely token


def test_greedy_logprob_row_has_rank_one():
    slots, _, reply = _logprob_step()
    j = _sampled_batch_rows(reply).index(slots.index(0))
    assert reply.logprobs.sampled_ranks[j] == 1
    assert reply.logprobs.top_token_ids[j][0] == reply.sampled_token_ids[j]


def test_no_logprobs_when_no_row_asks():
    sampler = make_sampler({1: (opts(temperature=0.5, seed=1), [1], [])}, 20)
    out = run(sampler, torch.randn(3, 20), [1, 1, 1], [1, 2, 3])
    assert out.logprobs is None
    reply = AsyncOutput(0, np.arange(3), np.ones(3, bool), out, HostTransfer(CPU)).get_output()
    assert reply.logprobs is None and len(reply.sampled_token_ids) == 3
    assert reply.num_sampled is None


def test_logprobs_zero_gives_only_the_sampled_token():
    sampler = make_sampler({1: (opts(temperature=1.0, seed=3, logprobs=0), [1], [])}, 20)
    logits = torch.randn(2, 20)
    out = run(sampler, logits, [1, 1], [4, 5])
    reply = AsyncOutput(0, np.arange(2), np.ones(2, bool), out, HostTransfer(CPU)).get_output()
    assert reply.logprobs.top_token_ids == [[], []]
    for j in range(2):
        token = reply.sampled_token_ids[j]
        want = torch.log_softmax(logits[j].double(), -1)[token].item()
        assert reply.logprobs.sampled_logprobs[j] == pytest.approx(want, abs=1e-5)


def test_sampler_through_the_triton_kernels_draws_what_the_torch_one_draws():
    # Every kernel the sampler launches on CUDA (penalties, filters, draw,
    # counts, logprobs), compiled on CUDA or under the interpreter on CPU,
    # against the torch references: the same tokens, counts and logprobs
    # over several steps of a mixed batch, with penalties on greedy and
    # sampled rows and filters of every kind.
    vocab = 300
    requests = {
        0: (opts(temperature=0.0, repetition_penalty=1.6, logprobs=2), [3, 4], [5]),
        1: (opts(temperature=0.8, top_p=0.8, presence_penalty=0.7, seed=3, logprobs=0), [6],
            [7, 7]),
        2: (opts(temperature=1.2, top_k=12, frequency_penalty=0.9, seed=4), [8, 9], []),
        3: (opts(temperature=0.5, min_p=0.05, seed=5), [1], []),
        4: (opts(temperature=1.0, seed=6), [2], [3]),
    }
    torch_sampler = make_sampler(requests, vocab)
    triton_sampler = make_sampler(requests, vocab, device=TRITON_DEVICE)
    triton_sampler.ops = triton_sampler.penalties.ops = triton_ops(TRITON_DEVICE)
    gen = torch.Generator().manual_seed(11)
    slots, mask = [3, 0, 4, 1, 2], [True, True, False, True, True]
    for step in range(4):
        logits = 3 * torch.randn(5, vocab, generator=gen)
        logits[:, [3, 5, 7, 9]] += 4.0  # earlier tokens lead: the penalties decide
        want = run(torch_sampler, logits, slots, [20 + step] * 5, mask)
        got = run(triton_sampler, logits, slots, [20 + step] * 5, mask)
        assert torch.equal(got.sampled_token_ids.cpu(), want.sampled_token_ids), step
        assert torch.equal(got.logprobs.sampled_ranks.cpu(), want.logprobs.sampled_ranks)
        torch.testing.assert_close(got.logprobs.sampled_logprobs.cpu(),
                                   want.logprobs.sampled_logprobs)
        torch.testing.assert_close(got.logprobs.top_logprobs.cpu(), want.logprobs.top_logprobs)
    assert torch.equal(triton_sampler.penalties.output_counts.cpu(),
                       torch_sampler.penalties.output_counts)
    assert int(torch_sampler.penalties.output_counts.sum()) > 4  # counted this call's tokens


# ---- CUDA: no host sync, same tokens as the CPU ----------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_sampler_never_syncs_and_matches_cpu():
    vocab = 1000
    requests = {s: (opts(**o), [1, 2, 3], [4]) for s, o in LOGPROB_REQS.items()}
    requests[5] = (opts(temperature=0.8, top_p=0.7, min_p=0.02, frequency_penalty=0.4,
                        seed=9, logprobs=1), [5], [])
    cuda = torch.device("cuda")
    gpu, cpu = make_sampler(requests, vocab, device=cuda), make_sampler(requests, vocab)
    gen = torch.Generator().manual_seed(2)
    slots, mask = [5, 0, 1, 2, 3, 4], [True, True, False, True, True, True]
    transfer = PinnedTransfer(cuda)
    idx_np = np.asarray(slots, dtype=np.int32)
    for step in range(4):
        logits = 4 * torch.randn(6, vocab, generator=gen)
        positions = [10 + step] * 6
        want = run(cpu, logits, slots, positions, mask)
        args = (logits.to(cuda), torch.from_numpy(idx_np).to(cuda), idx_np,
                torch.tensor(positions, device=cuda), torch.tensor(mask, device=cuda))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = gpu(*args)
            pending = AsyncOutput(step, np.arange(6), np.array(mask), out, transfer)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        reply = pending.get_output()
        assert torch.equal(out.sampled_token_ids.cpu(), want.sampled_token_ids)
        assert reply.sampled_token_ids == want.sampled_token_ids[torch.tensor(mask)].tolist()
        assert reply.logprobs is not None
        np.testing.assert_allclose(reply.logprobs.sampled_logprobs,
                                   want.logprobs.sampled_logprobs[torch.tensor(mask)], atol=1e-4)
    assert torch.equal(gpu.penalties.output_counts.cpu(), cpu.penalties.output_counts)


# ---- end to end ---------------------------------------------------------------

SEEDED = dict(temperature=0.9, top_p=0.9, top_k=50, seed=1234, max_tokens=12, ignore_eos=True)


def _generate(prompts, params, **llm_kwargs):
    from engine import LLM

    with LLM(model="tiny", device="cpu", **llm_kwargs) as llm:
        return llm.generate(prompts, params)


@pytest.mark.timeout(120)
def test_llm_seeded_sampling_is_reproducible_across_runs_and_batches():
    from engine import SamplingParams

    target = SamplingParams(**SEEDED)
    alone = _generate(["The quick brown fox"], target)[0].outputs[0].token_ids
    assert len(alone) == 12
    others = [
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=1.2, min_p=0.05, max_tokens=9, ignore_eos=True,
                       repetition_penalty=1.3, frequency_penalty=0.5, logprobs=2),
        SamplingParams(temperature=0.8, max_tokens=14, ignore_eos=True),
    ]
    prompts = ["hello", "The quick brown fox", "a much longer prompt " * 4, "zzz"]
    params = [others[0], target, others[1], others[2]]
    crowded = _generate(prompts, params, seed=7, max_num_batched_tokens=32, block_size=16)
    assert crowded[1].outputs[0].token_ids == alone
    again = _generate(["The quick brown fox"], target, seed=3)
    assert again[0].outputs[0].token_ids == alone


def _engine_logprobs(prompt, params):
    """Token ids and per-token logprob dicts of one request, from the engine's deltas."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model="tiny", device="cpu"))
    try:
        request = engine.add_request(prompt, params)
        tokens, logprobs = [], []
        while engine.has_unfinished_requests():
            for delta in engine.step():
                tokens += delta.new_token_ids
                logprobs += delta.logprobs or []
        return request.prompt_token_ids, tokens, logprobs
    finally:
        engine.shutdown()


@pytest.mark.timeout(120)
def test_engine_logprobs_match_transformers():
    import transformers

    from checkpoint.tiny_model import ensure_tiny_model
    from engine import SamplingParams

    params = SamplingParams(temperature=0.7, seed=11, max_tokens=8, ignore_eos=True,
                            logprobs=4, repetition_penalty=1.5)
    prompt, tokens, logprobs = _engine_logprobs("Logprobs, please", params)
    assert len(tokens) == len(logprobs) == 8
    model = transformers.AutoModelForCausalLM.from_pretrained(ensure_tiny_model())
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    want = torch.log_softmax(logits.double(), dim=-1)
    ranks = []
    for k, (token, entry) in enumerate(zip(tokens, logprobs)):
        top = torch.argsort(want[k], descending=True)[:4].tolist()
        assert all(entry[t].rank == r for r, t in enumerate(top, start=1))
        for t in top + [token]:
            assert entry[t].logprob == pytest.approx(want[k, t].item(), abs=1e-4)
        assert set(entry) == set(top) | {token}
        ranks.append(entry[token].rank)
        assert entry[token].rank == 1 + int((want[k] > want[k, token] + 1e-6).sum())
    assert max(ranks) > 1  # temperature and penalty move samples off the argmax


@pytest.mark.timeout(120)
def test_llm_returns_logprobs_when_asked():
    from engine import SamplingParams

    asked = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    sampled = SamplingParams(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True,
                             logprobs=0)
    plain = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)
    outs = _generate(["abc", "def", "ghi"], [asked, sampled, plain])
    greedy, zero, none = (o.outputs[0] for o in outs)
    assert none.logprobs is None
    assert len(greedy.logprobs) == len(greedy.token_ids) == 6
    for token, entry in zip(greedy.token_ids, greedy.logprobs):
        assert len(entry) == 3 and entry[token].rank == 1
        assert sorted(e.rank for e in entry.values()) == [1, 2, 3]
        values = [e.logprob for e in sorted(entry.values(), key=lambda e: e.rank)]
        assert values == sorted(values, reverse=True) and values[0] <= 0
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5
    assert len(zero.logprobs) == 6
    for token, entry in zip(zero.token_ids, zero.logprobs):
        assert list(entry) == [token] and entry[token].logprob <= 0
