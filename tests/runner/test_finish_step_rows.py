"""``finish_step_rows``: the torch reference and the Triton kernel (interpreted
on CPU) against a plain-Python oracle that walks the rows one by one."""

from __future__ import annotations

import random

import pytest
import torch

from runner.ops import torch_ops, triton_ops
from tests.helpers.kernel_device import KERNEL_DEVICE

IMPLS = {
    "ref": (torch_ops(torch.device("cpu")).finish_step_rows, torch.device("cpu")),
    "triton": (triton_ops(KERNEL_DEVICE).finish_step_rows, KERNEL_DEVICE),
}


def oracle(slots, seq_lens, positions, logits_indices, prefill_len, num_computed, num_reqs):
    computed = list(num_computed)
    for row in range(num_reqs):
        computed[slots[row]] = seq_lens[row]
    next_positions = [positions[t] + 1 for t in logits_indices]
    mask = [seq_lens[row] >= prefill_len[slots[row]] for row in range(num_reqs)]
    return slots[:num_reqs], next_positions, mask, computed


def run(impl, slots, seq_lens, positions, logits_indices, prefill_len, num_computed, num_reqs):
    fn, device = IMPLS[impl]

    def t(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)

    computed = t(num_computed, torch.int32)
    idx, next_positions, mask = fn(t(slots, torch.int32), t(seq_lens, torch.int32),
                                   t(positions, torch.int64), t(logits_indices, torch.int64),
                                   t(prefill_len, torch.int32), computed, num_reqs)
    assert idx.dtype == torch.int64 and mask.dtype == torch.bool
    return idx.tolist(), next_positions.tolist(), mask.tolist(), computed.tolist()


@pytest.mark.parametrize("impl", list(IMPLS))
def test_worked_example(impl: str) -> None:
    # Slot 4 decodes (prompt of 3, 5 computed after this step), slot 1 is in
    # its prefill (prompt of 10, 6 after this chunk), row 2 is padding
    # (slot 7, seq_len 0). Logits rows: the last token of rows 0 and 1.
    slots, seq_lens = [4, 1, 7], [5, 6, 0]
    positions = [4, 2, 3, 4, 5, 0, 0]
    logits_indices = [0, 4]
    prefill_len = [0, 10, 0, 0, 3, 0, 0, 0]
    num_computed = [9] * 8
    got = run(impl, slots, seq_lens, positions, logits_indices, prefill_len, num_computed, 3)
    assert got == ([4, 1, 7], [5, 6], [True, False, True], [9, 6, 9, 9, 5, 9, 9, 0])


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("seed", range(6))
def test_random_rows_match_oracle(impl: str, seed: int) -> None:
    rng = random.Random(seed)
    num_slots = rng.randint(4, 300)
    num_reqs = rng.randint(0, min(num_slots, 260))
    slots = rng.sample(range(num_slots), num_reqs) + [0] * rng.randint(0, 3)
    seq_lens = [rng.randint(0, 5000) for _ in slots]
    num_tokens = rng.randint(max(1, num_reqs), 400)
    positions = [rng.randint(0, 5000) for _ in range(num_tokens)]
    # Fewer, as many, or more logits rows than batch rows (drafts: every token).
    num_logits = rng.choice([num_reqs, min(num_tokens, num_reqs + 7), num_tokens])
    logits_indices = [rng.randrange(num_tokens) for _ in range(num_logits)]
    prefill_len = [rng.randint(0, 5000) for _ in range(num_slots)]
    num_computed = [rng.randint(0, 5000) for _ in range(num_slots)]
    args = (slots, seq_lens, positions, logits_indices, prefill_len, num_computed, num_reqs)
    assert run(impl, *args) == tuple(oracle(*args))
