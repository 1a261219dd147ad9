"""``allowed_token_ids`` and ``logit_bias`` in the sampler: each row's logits
as the rule says, written out per row in plain Python (allowed ids kept,
every other -inf, then each bias added), before the penalties; greedy rows
take the argmax of that; sampled rows never leave the allowed set; a reused
slot starts clean; the table widens past its first width. On the CPU, and
on the GPU where there is one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ipc.messages import SamplingOptions
from runner.sampler import Sampler
from tests.helpers.kernel_device import KERNEL_DEVICE
from tests.helpers.sampler_writes import write_added_requests

VOCAB = 40
DEVICES = sorted({torch.device("cpu"), KERNEL_DEVICE}, key=str)
on_devices = pytest.mark.parametrize("device", DEVICES, ids=str)


def _sampler(requests: dict[int, SamplingOptions], device: torch.device,
             max_reqs: int = 8) -> Sampler:
    sampler = Sampler(max_reqs, VOCAB, device, 0)
    for slot, options in requests.items():
        sampler.add_request(slot, options, 1, 1)
    write_added_requests(sampler, torch.zeros(max_reqs, 8, dtype=torch.int32, device=device))
    return sampler


def _expected_row(logits: list[float], options: SamplingOptions) -> list[float]:
    allowed = set(options.allowed_token_ids or range(VOCAB))
    row = [x if t in allowed else float("-inf") for t, x in enumerate(logits)]
    for t, b in (options.logit_bias or {}).items():
        row[t] += b
    return row


def _draw(sampler: Sampler, logits: torch.Tensor, slots: list[int]) -> torch.Tensor:
    device = sampler.token_keys.device
    idx = np.asarray(slots, dtype=np.int32)
    return sampler(logits.to(device), torch.from_numpy(idx).to(device), idx,
                   (torch.arange(len(slots)) + 1).to(device),
                   torch.ones(len(slots), dtype=torch.bool, device=device)
                   ).sampled_token_ids.cpu()


@on_devices
def test_rows_are_biased_and_restricted_as_written_out(device):
    requests = {
        0: SamplingOptions(temperature=0.0, logit_bias={3: 50.0, 0: -2.5, 7: 1.0}),
        1: SamplingOptions(temperature=0.0, allowed_token_ids=[0, 9, 17, 33]),
        2: SamplingOptions(temperature=0.0, allowed_token_ids=[5, 6],
                           logit_bias={6: 4.0, 12: 99.0}),  # 12 is not allowed: stays -inf
        3: SamplingOptions(temperature=0.0),
    }
    sampler = _sampler(requests, device)
    gen = torch.Generator().manual_seed(3)
    slots = [2, 0, 3, 1, 0]
    logits = torch.randn(len(slots), VOCAB, generator=gen).to(torch.bfloat16)
    idx = torch.tensor(slots, device=device)
    got = sampler.logit_bias.apply(logits.to(device), idx, np.asarray(slots)).cpu()
    assert got.dtype == torch.float32
    for i, slot in enumerate(slots):
        want = _expected_row(logits[i].float().tolist(), requests[slot])
        assert got[i].tolist() == want
    tokens = _draw(sampler, logits, slots).tolist()
    assert tokens == [max(range(VOCAB), key=_expected_row(logits[i].float().tolist(),
                                                          requests[s]).__getitem__)
                      for i, s in enumerate(slots)]
    assert tokens[1] == tokens[4] == 3 and tokens[2] == int(logits[2].float().argmax())


@on_devices
def test_bias_comes_before_the_repetition_penalty(device):
    """vLLM's order: the bias first, then the penalty divides the (now
    positive) logit of a token seen in the prompt."""
    options = SamplingOptions(temperature=0.0, logit_bias={4: 3.0}, repetition_penalty=2.0)
    sampler = Sampler(4, VOCAB, device, 0)
    sampler.add_request(0, options, 1, 1)
    table = torch.zeros(4, 8, dtype=torch.int32)
    table[0, 0] = 4  # the prompt is token 4
    write_added_requests(sampler, table.to(device))
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 4] = 1.0  # biased: 4.0, penalised: 2.0
    logits[0, 9] = 2.5  # unbiased, unseen: 2.5
    assert _draw(sampler, logits, [0]).tolist() == [9]
    logits[0, 9] = 1.5
    assert _draw(sampler, logits, [0]).tolist() == [4]


@on_devices
def test_sampled_rows_stay_in_the_allowed_set(device):
    allowed = [2, 11, 23, 39]
    sampler = _sampler({1: SamplingOptions(temperature=1.5, seed=7, allowed_token_ids=allowed)},
                       device)
    logits = torch.randn(400, VOCAB, generator=torch.Generator().manual_seed(5))
    tokens = _draw(sampler, logits, [1] * 400).tolist()
    assert set(tokens) <= set(allowed) and len(set(tokens)) == len(allowed)


@on_devices
def test_reused_slot_starts_clean_and_the_table_widens(device):
    many = {t: 0.5 for t in range(20)}  # wider than the first table
    sampler = _sampler({0: SamplingOptions(logit_bias=many, allowed_token_ids=list(range(30)))},
                       device)
    assert sampler.logit_bias.allowed.shape[1] >= 30
    logits = torch.zeros(1, VOCAB, device=device)
    slot = torch.tensor([0], device=device)
    row = sampler.logit_bias.apply(logits, slot, np.array([0]))[0].cpu()
    assert row[:20].tolist() == [0.5] * 20 and row[20:30].tolist() == [0.0] * 10
    assert torch.isinf(row[30:]).all()
    sampler.add_request(0, SamplingOptions(temperature=0.0), 1, 1)  # the slot reused
    write_added_requests(sampler, torch.zeros(8, 8, dtype=torch.int32, device=device))
    assert not sampler.logit_bias.any_active(np.array([0]))
    assert sampler.logit_bias.apply(logits, slot, np.array([0]))[0].tolist() == [0.0] * VOCAB


@on_devices
def test_a_left_slot_is_cleared_and_the_table_shrinks_to_its_users(device):
    """Slot 0's wide lists leave with its request: the table shrinks to what
    slot 1 still needs and slot 1's row keeps its rule; slot 0, taken then
    by a request without lists, meets an empty row beside slot 1."""
    wide = SamplingOptions(allowed_token_ids=list(range(36)), logit_bias={t: 0.5 for t in range(30)})
    kept = SamplingOptions(temperature=0.0, allowed_token_ids=[1, 2, 3, 5, 8, 13, 21, 34, 39],
                           logit_bias={2: 1.5, 34: -0.5})
    sampler = _sampler({0: wide, 1: kept}, device)
    assert sampler.logit_bias.allowed.shape[1] >= 36
    sampler.remove_request(0)
    write_added_requests(sampler, torch.zeros(8, 8, dtype=torch.int32, device=device))
    assert sampler.logit_bias.allowed.shape[1] == 9  # slot 1's nine allowed ids
    assert sampler.logit_bias.users.num_users == 1
    sampler.add_request(0, SamplingOptions(temperature=0.0), 1, 1)
    write_added_requests(sampler, torch.zeros(8, 8, dtype=torch.int32, device=device))
    # bfloat16 logits: their sums with the biases are exact in float32.
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    got = sampler.logit_bias.apply(logits.to(device), torch.tensor([1, 0], device=device),
                                   np.array([1, 0])).cpu()
    assert got[0].tolist() == _expected_row(logits[0].float().tolist(), kept)
    assert got[1].tolist() == logits[1].float().tolist()
    sampler.remove_request(1)
    sampler.remove_request(1)  # a slot without lists: nothing to do
    write_added_requests(sampler, torch.zeros(8, 8, dtype=torch.int32, device=device))
    assert sampler.logit_bias.users.num_users == 0 and sampler.logit_bias.allowed.shape[1] == 9
