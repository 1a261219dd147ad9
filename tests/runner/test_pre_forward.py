"""The host work before a step's forward pass, against plain references.

Covers: ``check_plan`` on new requests (the int32 prompts it returns, the
ids and block ids it refuses, new requests' token counts checked after the
cached ones); ``SamplingOptions.problems`` (hand-worked messages);
``make_input_batch`` against a per-row Python reference, with
and without drafts; unseeded requests' seeds (drawn ahead, the same numbers
as one draw at a time); float rows beyond float32 without a warning; the
prompt-logprobs slot count; the pinned ring's staging (with plain memory
standing in for pinned memory); the step's input meta carried by the
staged writes' launch when the step has one, and copied alone otherwise.
"""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch

from checkpoint.tiny_model import ensure_tiny_model
from ipc.errors import InvalidPlanError
from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
from runner.block_table import BlockTables
from runner.input_batch import InputBuffers, make_input_batch
from runner.plan_check import check_plan
from runner.request_state import RequestState
from runner.sampling.prompt_logprobs import NONE, PromptLogprobsState
from runner.sampling.states import SEEDS_AHEAD, TEMPERATURE, TOP_P, SamplingStates
from tests.helpers.runner_steps import make_runner

CPU = torch.device("cpu")
VOCAB, NUM_BLOCKS, BLOCK = 100, 40, 4


def new_req(req_id, ids, blocks, computed=0):
    return NewRequestData(req_id=req_id, prompt_token_ids=ids, prefill_token_ids=ids,
                          sampling=SamplingOptions(), block_ids=[blocks],
                          num_computed_tokens=computed, max_tokens=4)


def verdict(plan, states, tables):
    try:
        return check_plan(plan, states, tables, NUM_BLOCKS, 64, VOCAB, 0)
    except InvalidPlanError as exc:
        return str(exc)


def empty_state():
    return RequestState(8, 32, CPU), BlockTables(BLOCK, 8, 8, 64, CPU)


# ---- check_plan on new requests --------------------------------------------------

def test_check_plan_returns_the_new_prompts_as_int32_in_plan_order():
    states, tables = empty_state()
    a, b = [5, 0, 99, 7], list(range(10, 30))
    got = verdict(SchedulerOutput(step_id=1, scheduled_new_reqs=[
        new_req("a", a, [3]), new_req("b", b, [4, 5, 6, 7, 8])],
        num_scheduled_tokens=[4, 20]), states, tables)
    assert [g.dtype for g in got] == [np.int32, np.int32]
    assert [g.tolist() for g in got] == [a, b]
    plan = SchedulerOutput(step_id=2, finished_req_ids=["x"])
    assert verdict(plan, states, tables) == []


@pytest.mark.parametrize("bad", [-1, VOCAB, 2**40, 2**63, 2**64 - 1])
def test_check_plan_refuses_prompt_ids_outside_the_vocabulary(bad):
    states, tables = empty_state()
    plan = SchedulerOutput(step_id=3, scheduled_new_reqs=[new_req("a", [1, bad, 2], [0])],
                           num_scheduled_tokens=[3])
    assert verdict(plan, states, tables) == (
        f"step 3: request 'a': token ids outside the vocabulary [0, {VOCAB})")


def test_check_plan_names_the_first_block_id_outside_the_cache():
    states, tables = empty_state()
    plan = SchedulerOutput(step_id=4, scheduled_new_reqs=[
        new_req("a", [1, 2], [0, NUM_BLOCKS + 3, -1, NUM_BLOCKS])], num_scheduled_tokens=[2])
    assert verdict(plan, states, tables) == (
        f"step 4: request 'a': block id {NUM_BLOCKS + 3} outside the cache [0, {NUM_BLOCKS})")
    plan = SchedulerOutput(step_id=4, scheduled_new_reqs=[new_req("a", [1, 2], [-2, 5])],
                           num_scheduled_tokens=[2])
    assert "block id -2 outside" in verdict(plan, states, tables)


def test_new_requests_token_counts_are_checked_after_the_cached_ones():
    """Plan order is the cached requests, then the new ones: a bad cached
    request is named before a bad new one; a bad new one alone is named."""
    states, tables = empty_state()
    slot = states.add_request(new_req("c", [1] * 4, []))
    tables.add_request(slot, [0])  # room for 4 tokens, 4 computed: none left
    states.set_num_computed_tokens(slot, 4)
    cached_bad = CachedRequestData(req_ids=["c"], new_block_ids=[None])
    cached_ok = CachedRequestData(req_ids=["c"], new_block_ids=[[[1]]])
    new_bad = new_req("n", [1] * 6, [2])  # 6 tokens, room for 4
    for cached, want in ((cached_bad, "request 'c': tokens up to 5 but KV room for 4"),
                         (cached_ok, "request 'n': tokens up to 6 but KV room for 4")):
        plan = SchedulerOutput(step_id=5, scheduled_cached_reqs=cached,
                               scheduled_new_reqs=[new_bad], num_scheduled_tokens=[1, 6])
        assert want in verdict(plan, states, tables)
    plan = SchedulerOutput(step_id=5, scheduled_cached_reqs=cached_ok,
                           scheduled_new_reqs=[new_req("n", [1] * 4, [2])],
                           num_scheduled_tokens=[1, 5])
    assert "request 'n': tokens up to 5 but KV room for 4" in verdict(plan, states, tables)
    plan = SchedulerOutput(step_id=5, scheduled_new_reqs=[new_req("n", [1] * 4, [2], 1)],
                           num_scheduled_tokens=[3])
    assert verdict(plan, states, tables)[0].tolist() == [1] * 4


# ---- make_input_batch ------------------------------------------------------------

def reference_batch(req_ids, counts, slots, computed, prefill, rows_padded, dq):
    """Every host field, row by row in Python: rows with drafts, then rows of
    exactly ``dq`` tokens, then the rest by count (ties in plan order)."""
    drafts = [dq > 1 and n > 1 and computed[slots[r]] >= prefill[slots[r]]
              for r, n in zip(req_ids, counts)]
    order = sorted(range(len(req_ids)), key=lambda i: (not drafts[i], counts[i] != dq, counts[i]))
    qsl, logits = [0], [0]
    for i in order:
        qsl.append(qsl[-1] + counts[i])
        logits.append(logits[-1] + (counts[i] if drafts[i] else 1))
    pad = rows_padded - len(order)
    seq = [computed[slots[req_ids[i]]] + counts[i] for i in order]
    n_draft = sum(drafts)
    if n_draft:
        num_decodes = next((k for k, i in enumerate(order) if counts[i] != 1), len(order))
    else:
        num_decodes = sum(c == 1 for c in counts)
        if dq > 1 and num_decodes and counts[order[0]] != 1:
            num_decodes = 0
    return dict(
        req_ids=[req_ids[i] for i in order], plan_order=order,
        idx=[slots[req_ids[i]] for i in order], scheduled=[counts[i] for i in order],
        qsl=qsl + [qsl[-1]] * pad, seq_lens=seq,
        sample_mask=[s >= prefill[slots[req_ids[i]]] for s, i in zip(seq, order)],
        num_tokens=sum(counts), num_decodes=num_decodes,
        has_prefill=any(computed[slots[req_ids[i]]] < prefill[slots[req_ids[i]]] for i in order),
        num_logits=[counts[i] if drafts[i] else 1 for i in order],
        cu_num_logits=logits + [logits[-1]] * pad, num_draft_rows=n_draft)


@pytest.mark.parametrize("dq", [1, 3])
def test_make_input_batch_matches_a_row_by_row_reference(dq):
    rng = random.Random(dq)
    for _ in range(300):
        n = rng.randint(0, 10)
        req_ids = [f"r{i}" for i in range(n)]
        slots = dict(zip(req_ids, rng.sample(range(16), n)))
        computed = np.array([rng.randint(0, 40) for _ in range(17)], dtype=np.int32)
        prefill = np.array([rng.randint(1, 40) for _ in range(17)], dtype=np.int32)
        counts = [rng.choice([1, 1, 2, 3, 3, 5, 17]) for _ in range(n)]
        if rng.random() < 0.3:
            counts = [counts[0]] * n if n else []  # equal counts keep the plan's order
        pad = n + rng.choice([0, 0, 3])
        batch = make_input_batch(req_ids, counts, slots, computed, prefill,
                                 num_reqs_padded=pad, decode_query_len=dq)
        want = reference_batch(req_ids, counts, slots, computed, prefill, pad, dq)
        got = dict(
            req_ids=batch.req_ids, plan_order=batch.plan_order.tolist(),
            idx=batch.idx_mapping_np.tolist(), scheduled=batch.num_scheduled_np.tolist(),
            qsl=batch.query_start_loc_np.tolist(), seq_lens=batch.seq_lens_np.tolist(),
            sample_mask=batch.sample_mask_np.tolist(), num_tokens=batch.num_tokens,
            num_decodes=batch.num_decodes, has_prefill=batch.has_prefill,
            num_logits=batch.num_logits_np.tolist(),
            cu_num_logits=batch.cu_num_logits_np.tolist(), num_draft_rows=batch.num_draft_rows)
        assert got == want
        assert batch.num_logits == want["cu_num_logits"][n]


# ---- sampling rows ---------------------------------------------------------------

def test_unseeded_requests_get_the_generators_draws_one_by_one():
    """More requests than one draw-ahead holds, seeded ones among them: the
    unseeded ones get, in order, what ``rng.integers(0, 2**62)`` called once
    per request returns."""
    states = SamplingStates(4, CPU, seed=11)
    reference = np.random.default_rng(11)
    for i in range(2 * SEEDS_AHEAD + 7):
        seeded = i % 5 == 0
        states.add_request(i % 4, SamplingOptions(temperature=0.7,
                                                  seed=1000 + i if seeded else None))
        (_, _, value), = states.seeds.take_writes()
        want = 1000 + i if seeded else int(reference.integers(0, 2**62))
        assert int(value[0]) == want


def test_seeds_are_stored_as_given_over_the_signed_64_bit_range():
    """A seed reaches the device table unchanged: s and s - 2**63 stay two
    seeds (their low 63 bits are the same)."""
    states = SamplingStates(2, CPU, seed=0)
    for seed in (5, 5 - 2**63, -1, 2**63 - 1, -(2**63)):
        states.add_request(1, SamplingOptions(temperature=1.0, seed=seed))
        (_, _, value), = states.seeds.take_writes()
        assert int(value[0]) == seed


def test_float_rows_beyond_float32_become_inf_without_a_warning():
    states = SamplingStates(2, CPU, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        states.add_request(0, SamplingOptions(temperature=1e39, top_p=0.5))
        states.add_request(1, SamplingOptions(temperature=0.0, top_p=0.5, min_p=0.2))
    assert states.floats_np[0, TEMPERATURE] == np.inf and states.floats_np[0, TOP_P] == 0.5
    assert states.floats_np[1].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]  # greedy: filters off
    states.add_request(1, SamplingOptions(temperature=0.3, min_p=0.1, repetition_penalty=1.2,
                                          presence_penalty=-0.5, frequency_penalty=0.25))
    assert states.floats_np[1].tolist() == np.array([0.3, 1.0, 0.1, 1.2, -0.5, 0.25],
                                                    dtype=np.float32).tolist()


def test_prompt_logprobs_slot_count_follows_the_slots():
    state = PromptLogprobsState(4, CPU)
    computed, prompt_len = np.zeros(4, dtype=np.int32), np.full(4, 10, dtype=np.int32)
    index = {"a": 0, "b": 1}
    rng = random.Random(0)
    for _ in range(200):
        state.add_request(rng.randrange(4), rng.choice([None, None, 0, 3]))
        assert state.num_asking == int(np.sum(state.num_top_np != NONE))
        want = any(state.num_top_np[s] != NONE for s in index.values())
        assert state.needs_eager(["a", "b"], index, computed, prompt_len) == want
    for slot in range(4):
        state.add_request(slot, None)
    assert state.num_asking == 0
    assert state.compute(None, ["a"], np.array([0]), np.array([0, 5]), np.array([0]),
                         np.array([5]), prompt_len, None, None, VOCAB) is None


# ---- pinned staging ----------------------------------------------------------------

def test_pinned_ring_stages_arrays_whole_and_reserved_buffers_do_not_grow(monkeypatch):
    """The ring's staging with plain host memory standing in for pinned
    memory (no CUDA here): every view equals its array (dtypes, shapes,
    empty and read-only arrays), and a reserved ring keeps its buffers."""
    from runner import transfer

    empty = torch.empty
    monkeypatch.setattr(transfer.torch, "empty",
                        lambda *a, pin_memory=False, **k: empty(*a, **k))
    ring = transfer.PinnedRing()
    ring.reserve(4096)
    buffers = list(ring.buffers)
    assert all(b.numel() >= 4096 for b in buffers)
    rng = np.random.default_rng(0)
    for i in range(3 * transfer.RING_SIZE):
        a = rng.integers(-2**31, 2**31 - 1, size=(1 + 13 * i,)).astype(np.int32)
        b = rng.standard_normal((i % 4, 3)).astype(np.float32)
        c = rng.integers(0, 255, size=(7,)).astype(np.uint8)
        c.flags.writeable = False
        d = np.arange(i, dtype=np.int64)
        views = ring.stage([a, b, c, d])
        for array, view in zip((a, b, c, d), views):
            assert view.dtype == torch.from_numpy(array.copy()).dtype
            assert np.array_equal(view.numpy(), array)
        ring.next = (ring.next + 1) % transfer.RING_SIZE  # what ``copied`` moves on
    assert [b.data_ptr() for b in ring.buffers] == [b.data_ptr() for b in buffers]
    ring.stage([np.zeros(5000, dtype=np.uint8)])
    assert ring.buffers[ring.next].numel() >= 5000


# ---- the step's input meta -------------------------------------------------------

@pytest.mark.timeout(120)
def test_step_meta_rides_in_the_staged_writes_launch_and_is_copied_alone_otherwise(tmp_path):
    """A step that adds a request uploads once and launches once (its meta
    inside); a decode step without staged writes copies the meta alone, and
    nothing where the device holds that meta already (the batch of the step
    before). In each, the device's idx_mapping and query_start_loc are the
    batch's, and the tokens are those of the same steps with the meta
    always copied."""
    model_dir = ensure_tiny_model(str(tmp_path))
    runners = [make_runner(model_dir) for _ in range(2)]
    calls = {"copy": 0, "upload": 0}
    r = runners[0]
    for name, obj, method in (("copy", r.buffers.transfer, "copy_into"),
                              ("upload", r.staged_writes.transfer, "upload")):
        real = getattr(obj, method)

        def counted(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        setattr(obj, method, counted)
    # The reference runner copies the meta itself at every step.
    ref = runners[1]
    ref.staged_writes.apply_writes = lambda extra=None, _apply=ref.staged_writes.apply_writes: (
        _apply() and False)
    ref.buffers.holds_step_meta = lambda meta: False
    prompts = {"a": list(range(3, 30)), "b": [9, 8, 7]}
    new = [NewRequestData(req_id=k, prompt_token_ids=p, prefill_token_ids=p,
                          sampling=SamplingOptions(temperature=0.0), block_ids=[blocks],
                          num_computed_tokens=0, max_tokens=4)
           for (k, p), blocks in zip(prompts.items(), ([0, 1], [4]))]
    plans = [SchedulerOutput(step_id=0, scheduled_new_reqs=new, num_scheduled_tokens=[27, 3])]
    plans += [SchedulerOutput(step_id=s, scheduled_cached_reqs=CachedRequestData(
        req_ids=["a", "b"], new_block_ids=[[[2]] if s == 2 else None, None]),
        num_scheduled_tokens=[1, 1]) for s in (1, 2, 3)]
    plans.append(SchedulerOutput(step_id=4, scheduled_cached_reqs=CachedRequestData(
        req_ids=["b"], new_block_ids=[None]), num_scheduled_tokens=[1]))
    # (copies, uploads) after each step: steps 2 and 3 keep step 1's meta
    # (step 2 uploads a new block, without the meta); step 4 has one row.
    expected_calls = [(0, 1), (1, 1), (1, 2), (1, 2), (2, 2)]
    for plan, want_calls in zip(plans, expected_calls):
        tokens = []
        for runner in runners:
            runner.execute_model(plan)
            batch = runner.pending.batch
            n, m = batch.num_reqs, len(batch.query_start_loc_np)
            assert runner.buffers.idx_mapping[:n].tolist() == batch.idx_mapping_np.tolist()
            assert (runner.buffers.query_start_loc[:m].tolist()
                    == batch.query_start_loc_np.tolist())
            tokens.append(runner.sample_tokens().get_output().rows())
        assert tokens[0] == tokens[1]
        assert (calls["copy"], calls["upload"]) == want_calls


def test_input_buffers_know_the_meta_the_device_holds():
    """holds_step_meta is true exactly for a prefix of what was last
    written, and false for anything once a capture filled the buffers on
    the device."""
    buffers = InputBuffers(4, 16, torch.device("cpu"))
    step = buffers.stage_step_meta(np.array([2, 0]), np.array([0, 1, 2, 2]), pad_slot=4).copy()
    assert not buffers.holds_step_meta(step)  # the device holds zeros
    buffers.copy_staged_meta(step)
    assert buffers.step_meta[: len(step)].tolist() == step.tolist()
    assert buffers.holds_step_meta(step)
    assert buffers.holds_step_meta(step[:3])
    other = buffers.stage_step_meta(np.array([0, 2]), np.array([0, 1, 2, 2]), pad_slot=4)
    assert not buffers.holds_step_meta(other)
    buffers.fill_for_capture(2, pad_slot=4)
    assert buffers.idx_mapping[:2].tolist() == [4, 4]
    assert not buffers.holds_step_meta(step[:1])


def test_sampling_problems_name_every_field_out_of_range():
    """Every check fails: each message, formatted with its value, in field
    order; a valid request has none."""
    bad = SamplingOptions(temperature=-1.5, top_p=0.0, top_k=-2, min_p=1.5,
                          repetition_penalty=0.0, presence_penalty=2.5, frequency_penalty=-3.0,
                          logprobs=-3, min_tokens=-4, prompt_logprobs=-2)
    assert bad.problems() == [
        "temperature must be >= 0 (0 = greedy), got -1.5",
        "top_p must be in (0, 1], got 0.0",
        "top_k must be >= 0 (0 or -1 = disabled), got -2",
        "min_p must be in [0, 1], got 1.5",
        "repetition_penalty must be > 0 (1 = off), got 0.0",
        "presence_penalty must be in [-2, 2] (0 = off), got 2.5",
        "frequency_penalty must be in [-2, 2] (0 = off), got -3.0",
        "logprobs must be None, an int >= 0 or -1 (the whole vocabulary), got -3",
        "min_tokens must be >= 0, got -4",
        "prompt_logprobs must be None, an int >= 0 or -1 (the whole vocabulary), got -2",
    ]
    assert SamplingOptions(temperature=0.7, top_p=0.9, logprobs=0).problems() == []
    assert SamplingOptions(logprobs=-1, prompt_logprobs=-1).problems() == []  # whole vocabulary
    assert SamplingOptions(top_p=float("nan")).problems() == ["top_p must be in (0, 1], got nan"]
