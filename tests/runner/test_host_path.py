"""The runner's host bookkeeping against plain references.

Covers: the sampler's batch flags (``SamplingStates.flags``, from per-slot
bits) against the flags recomputed from the host mirrors' values; slot
reuse of ``min_tokens`` (a request without a rule on a slot that had one is
not held back, beside a row that is); ``check_plan``'s verdict on cached
requests (the first problem named, in plan order); staged writes packed
into one buffer whose views keep their alignment.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from ipc.errors import InvalidPlanError
from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
from runner.block_table import BlockTables
from runner.plan_check import check_plan
from runner.request_state import RequestState
from runner.sampler import Sampler
from runner.sampling.states import (
    FREQUENCY,
    MIN_P,
    NO_LOGPROBS,
    PRESENCE,
    REPETITION,
    TEMPERATURE,
    TOP_P,
    SamplingStates,
)
from runner.staged_write_group import pack_grouped_writes
from tests.helpers.sampler_writes import write_added_requests

CPU = torch.device("cpu")


def reference_flags(states: SamplingStates, slots: np.ndarray) -> tuple:
    """The batch flags straight from the float table, top-k and logprobs mirrors."""
    f = states.floats_np[slots]
    return (bool(np.all(f[:, TEMPERATURE] == 0.0)),
            bool(np.any(f[:, REPETITION] != 1.0) or np.any(f[:, PRESENCE] != 0.0)
                 or np.any(f[:, FREQUENCY] != 0.0)),
            bool(np.any(f[:, MIN_P] > 0.0)), bool(np.any(f[:, TOP_P] < 1.0)),
            int(states.top_k_np[slots].max(initial=0)),
            int(states.num_logprobs_np[slots].max(initial=NO_LOGPROBS)))


def random_options(rng: random.Random) -> SamplingOptions:
    kw = {}
    if rng.random() < 0.5:
        kw.update(temperature=rng.choice([0.5, 1.0, 2.0]))
        if rng.random() < 0.4:
            kw["top_k"] = rng.choice([1, 5, 50])
        if rng.random() < 0.4:
            kw["top_p"] = rng.choice([0.5, 0.9, 1.0])
        if rng.random() < 0.3:
            kw["min_p"] = rng.choice([0.0, 0.1])
    else:
        kw["temperature"] = 0.0
    if rng.random() < 0.2:
        kw["repetition_penalty"] = 1.3
    if rng.random() < 0.2:
        kw["presence_penalty"] = rng.choice([0.0, 0.5])
    if rng.random() < 0.2:
        kw["frequency_penalty"] = -0.5
    if rng.random() < 0.3:
        kw["logprobs"] = rng.choice([0, 1, 5])
    return SamplingOptions(**kw)


def test_batch_flags_match_the_mirrors_through_slot_reuse():
    rng = random.Random(0)
    states = SamplingStates(12, CPU, seed=0)
    for slot in range(12):  # batches hold added slots only
        states.add_request(slot, random_options(rng))
    seen_non_plain = False
    for _ in range(300):
        # Reuse slots: a slot's flags must follow its latest request only.
        states.add_request(rng.randrange(12), random_options(rng))
        slots = np.array(rng.sample(range(12), rng.randint(0, 12)), dtype=np.int32)
        flags = states.flags(slots)
        got = (flags.all_greedy, flags.any_penalty, flags.any_min_p, flags.any_top_p,
               flags.max_top_k, flags.max_logprobs)
        assert got == reference_flags(states, slots)
        seen_non_plain |= not flags.all_greedy and flags.max_logprobs >= 0
    assert seen_non_plain
    for slot in range(12):  # every slot plain again: the count drops to zero
        states.add_request(slot, SamplingOptions(temperature=0.0))
    assert states.num_needing == 0
    assert states.flags(np.arange(12, dtype=np.int32)) == states.flags(np.array([0]))


def test_min_tokens_rule_leaves_with_its_request():
    """Slot 0 held token 3 back for its old request; its new request (no rule)
    samples 3, while slot 1's rule holds back 4, in the same batch."""
    vocab, prompt = 8, list(range(5))
    sampler = Sampler(4, vocab, CPU, seed=0)
    table = torch.zeros(4, 32, dtype=torch.int32)
    table[:2, :5] = torch.tensor(prompt, dtype=torch.int32)
    sampler.add_request(0, SamplingOptions(temperature=0.0, min_tokens=4), 5, 5, [3])
    write_added_requests(sampler, table)
    assert sampler.min_tokens.users.num_users == 1
    sampler.add_request(0, SamplingOptions(temperature=0.0), 5, 5, [3])  # reused, no rule
    sampler.add_request(1, SamplingOptions(temperature=0.0, min_tokens=4), 5, 5, [4])
    write_added_requests(sampler, table)
    assert sampler.min_tokens.users.num_users == 1
    logits = torch.zeros(2, vocab)
    logits[0, 3] = 5.0
    logits[1, 4] = 5.0
    logits[1, 6] = 1.0
    idx = np.array([0, 1], dtype=np.int32)
    # Position 2 lies inside the old request's prompt of 5: that rule would hold.
    out = sampler(logits, torch.from_numpy(idx).long(), idx, torch.tensor([2, 5]),
                  torch.ones(2, dtype=torch.bool))
    assert out.sampled_token_ids.tolist() == [3, 6]
    sampler.add_request(1, SamplingOptions(temperature=0.0), 5, 5, [4])
    write_added_requests(sampler, table)
    assert sampler.min_tokens.users.num_users == 0
    assert not sampler.min_tokens.any_active(idx)
    out = sampler(logits, torch.from_numpy(idx).long(), idx, torch.tensor([5, 5]),
                  torch.ones(2, dtype=torch.bool))
    assert out.sampled_token_ids.tolist() == [3, 4]



def test_min_tokens_table_shrinks_once_a_long_rule_leaves():
    """Slot 2's rule holds 20 ids back (the table widens to 20); it leaves
    and its slot is taken by a request without a rule in the same plan: the
    table shrinks to the initial 8, slot 1's rule, carried across both
    resizes, still holds 4 and 6 back, and slot 2 samples its top token."""
    vocab, prompt = 32, list(range(5))
    sampler = Sampler(4, vocab, CPU, seed=0)
    table = torch.zeros(4, 32, dtype=torch.int32)
    table[1:3, :5] = torch.tensor(prompt, dtype=torch.int32)
    sampler.add_request(1, SamplingOptions(temperature=0.0, min_tokens=4), 5, 5, [4, 6])
    sampler.add_request(2, SamplingOptions(temperature=0.0, min_tokens=4), 5, 5,
                        list(range(8, 28)))
    write_added_requests(sampler, table)
    assert sampler.min_tokens.stop_ids.shape[1] == 20
    sampler.remove_request(2)
    sampler.add_request(2, SamplingOptions(temperature=0.0), 5, 5, [9])
    write_added_requests(sampler, table)
    assert sampler.min_tokens.stop_ids.shape[1] == 8
    assert sampler.min_tokens.users.num_users == 1
    logits = torch.zeros(2, vocab)
    logits[:, 4], logits[:, 6], logits[:, 9], logits[:, 3] = 5.0, 4.0, 3.0, 1.0
    idx = np.array([1, 2], dtype=np.int32)
    out = sampler(logits, torch.from_numpy(idx).long(), idx, torch.tensor([5, 5]),
                  torch.ones(2, dtype=torch.bool))
    assert out.sampled_token_ids.tolist() == [9, 4]

# ---- check_plan on cached requests --------------------------------------------

BLOCK, MAX_LEN, MAX_BLOCKS = 4, 32, 8


def held_state(computed: dict[str, tuple[int, int, int]]):
    """RequestState and BlockTables holding requests {id: (prefill, computed, blocks)}."""
    states = RequestState(8, MAX_LEN, CPU)
    tables = BlockTables(BLOCK, 8, MAX_BLOCKS, 64, CPU)
    next_block = 0
    for req_id, (prefill, done, blocks) in computed.items():
        slot = states.add_request(NewRequestData(
            req_id=req_id, prompt_token_ids=[1] * prefill, prefill_token_ids=[1] * prefill,
            sampling=SamplingOptions(), block_ids=[[]], num_computed_tokens=done,
            max_tokens=4))
        tables.add_request(slot, list(range(next_block, next_block + blocks)))
        next_block += blocks
    return states, tables


def decode_plan(ids, counts, blocks=None, spec_counts=None, step=7):
    blocks = blocks or [None] * len(ids)
    return SchedulerOutput(step_id=step, scheduled_cached_reqs=CachedRequestData(
        req_ids=ids, new_block_ids=blocks, num_computed_tokens=spec_counts),
        num_scheduled_tokens=counts)


def verdict(plan, states, tables, spec=0):
    try:
        check_plan(plan, states, tables, 40, 64, 100, spec)
    except InvalidPlanError as exc:
        return str(exc)
    return None


def test_check_plan_names_the_first_bad_cached_request():
    # a: decoding at 8 of 12 slots; b: decoding at 11 of 12 (room for 1);
    # c: prefilling, 3 of 10 computed, 3 blocks (12 slots).
    states, tables = held_state({"a": (4, 8, 3), "b": (4, 11, 3), "c": (10, 3, 3)})
    ok = decode_plan(["a", "b", "c"], [1, 1, 7])
    assert verdict(ok, states, tables) is None
    cases = [
        (decode_plan(["a", "b", "c"], [1, 2, 7]), "request 'b' decodes 2 tokens"),
        (decode_plan(["a", "b", "c"], [1, 1, 10]), "request 'c': tokens up to 13 but KV room "
                                                   "for 12"),
        (decode_plan(["a", "b", "c"], [0, 5, 7]), "request 'a': 0 scheduled tokens"),
        (decode_plan(["a", "a"], [1, 1]), "unknown request 'a'"),
        (decode_plan(["a", "ghost"], [1, 1]), "unknown request 'ghost'"),
        # The blocks of 'a' are checked before the unknown id after it.
        (decode_plan(["a", "ghost"], [1, 1], blocks=[[[99]], None]),
         "request 'a': block id 99 outside the cache"),
        (decode_plan(["a", "b"], [1, 2**70]), "request 'b' decodes " + str(2**70)),
        (decode_plan(["a", "b"], [1, 2], blocks=[None, [[20]]]), "request 'b' decodes 2"),
    ]
    for plan, message in cases:
        assert message in (verdict(plan, states, tables) or "no error"), message
    # A new block counts in the room: 'c' then holds 4 blocks, 16 slots.
    assert verdict(decode_plan(["c"], [7], blocks=[[[20]]]), states, tables) is None
    assert "request 'c': tokens up to 17 but KV room for 16" in verdict(
        decode_plan(["c"], [14], blocks=[[[20]]]), states, tables)


def test_check_plan_with_draft_counts_uses_the_plan_counts():
    states, tables = held_state({"a": (4, 8, 3)})
    assert verdict(decode_plan(["a"], [3], spec_counts=[9]), states, tables, spec=2) is None
    assert "tokens up to 13 but KV room for 12" in verdict(
        decode_plan(["a"], [3], spec_counts=[10]), states, tables, spec=2)
    assert "decodes 4 tokens: at most 1 + 2" in verdict(
        decode_plan(["a"], [4], spec_counts=[2**66]), states, tables, spec=2)
    assert "tokens up to" in verdict(
        decode_plan(["a"], [1], spec_counts=[2**66]), states, tables, spec=2)


# ---- packed staged writes -----------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.int64])
def test_packed_writes_share_one_aligned_buffer(dtype):
    """Three writes to one target, two of them touching (merged into one
    segment): one buffer, header then values, the values 16-byte aligned."""
    dst = torch.zeros(3, 8, dtype=dtype)
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    writes = [(r, s, np.arange(n, dtype=np_dtype)) for r, s, n in [(2, 0, 5), (0, 3, 1), (2, 5, 2)]]
    packed = pack_grouped_writes([(dst, writes)])
    assert packed.words_offset % 16 == 0
    assert (packed.num_targets, packed.num_writes) == (1, 2)
    header = packed.blob[: packed.words_offset].view(np.int64)
    words_per_value = np_dtype.itemsize // 4
    assert header[5: 5 + 4 * 2 + 1].tolist() == [  # after the target table of 5 words
        0, 0,  # target of each write
        2, 0,  # rows
        0, 3,  # starts
        0, 7 * words_per_value, 8 * words_per_value,  # cu_words
    ]
    values = packed.blob[packed.words_offset:].view(np_dtype)
    assert values.tolist() == [0, 1, 2, 3, 4, 0, 1, 0]
    assert packed.blob.nbytes == packed.words_offset + 8 * np_dtype.itemsize
