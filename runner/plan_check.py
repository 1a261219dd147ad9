"""Checking a SchedulerOutput against the runner's state before applying it.

A plan that breaks the runner's invariants must fail with a clear error and
change nothing. Every rank holds the same state and receives the same plan,
so every rank reaches the same verdict before any collective: no rank can
crash while the others wait in an all-reduce.
"""

from __future__ import annotations

import numpy as np

from ipc.config import LoRAConfig
from ipc.errors import InvalidPlanError
from ipc.messages import SchedulerOutput


def check_plan(plan: SchedulerOutput, states, block_tables, num_blocks: int,
               max_num_batched_tokens: int, vocab_size: int,
               num_speculative_tokens: int = 0,
               lora: LoRAConfig | None = None) -> list[np.ndarray]:
    """Raise ``InvalidPlanError`` naming the first problem found. A request
    past its prefill decodes 1 token, plus at most ``num_speculative_tokens``
    drafts. Adapter slots (loads and new requests') lie in
    ``[0, lora.max_loras)``, and there are none without ``lora``.

    ``states`` is the runner's RequestState, ``block_tables`` its
    BlockTables; neither is changed. Returns the new requests' prefill
    token ids (plan order) as the int32 arrays the check made of them, so
    that a prompt is converted from its list once a step, not twice.
    """

    def fail(message: str) -> None:
        raise InvalidPlanError(f"step {plan.step_id}: {message}")

    index = states.req_id_to_index
    max_len, max_blocks = states.max_model_len, block_tables.max_num_blocks_per_req
    leaving = list(plan.finished_req_ids) + list(plan.preempted_req_ids)
    if len(set(leaving)) != len(leaving):
        fail("a request is finished or preempted twice (its slot would be freed twice)")
    remaining = set(index) - set(leaving)
    new_ids = [new.req_id for new in plan.scheduled_new_reqs]
    if len(set(new_ids)) != len(new_ids) or remaining & set(new_ids):
        fail("a new request id is already in the runner")
    free = len(states.free_indices) + sum(1 for r in leaving if r in index)
    if len(new_ids) > free:
        fail(f"{len(new_ids)} new requests but {free} free slots")
    _check_lora_slots(fail, plan, lora)
    # Per request after the plan: (computed tokens, blocks held, prefill length).
    after: dict[str, tuple[int, int, int]] = {}
    prefill_ids = []
    for new in plan.scheduled_new_reqs:
        prefill_ids.append(_check_new_request(fail, new, max_len, vocab_size, num_blocks,
                                              max_blocks, after))
    cached = plan.scheduled_cached_reqs
    if len(cached.req_ids) != len(cached.new_block_ids):
        fail("cached request lists differ in length")
    host_counts = cached.num_computed_tokens
    needed = num_speculative_tokens > 0 and bool(cached.req_ids)
    if (host_counts is None and needed) or (host_counts is not None and (
            num_speculative_tokens == 0 or len(host_counts) != len(cached.req_ids))):
        fail("cached requests' num_computed_tokens must come with speculative decoding, "
             "one per request, and only then")
    computed, held, prefill = _cached_after(fail, cached, remaining, after, states,
                                            block_tables, num_blocks, max_blocks)
    req_ids = plan.scheduled_req_ids()
    if len(plan.num_scheduled_tokens) != len(req_ids):
        fail(f"{len(plan.num_scheduled_tokens)} token counts for {len(req_ids)} requests")
    # Plan order: the cached requests (on arrays), then the new ones (few:
    # one by one).
    counts, num_cached = plan.num_scheduled_tokens, len(cached.req_ids)
    if num_cached:
        _check_token_counts(fail, req_ids[:num_cached], counts[:num_cached], computed, held,
                            prefill, max_len, block_tables.block_size, num_speculative_tokens)
    for req_id, n, (done, blocks, prefill_len) in zip(req_ids[num_cached:], counts[num_cached:],
                                                      after.values()):
        _check_request_tokens(fail, req_id, n, done, blocks, prefill_len, max_len,
                              block_tables.block_size, num_speculative_tokens)
    total = sum(counts)
    constrained = plan.structured_output_req_ids
    if len(set(constrained)) != len(constrained):
        fail("a request is listed twice in structured_output_req_ids")
    if not set(constrained) <= set(req_ids):
        extra = sorted(set(constrained) - set(req_ids))
        fail(f"structured_output_req_ids names requests not scheduled: {extra[:5]}")
    if total > max_num_batched_tokens:
        fail(f"{total} tokens exceed max_num_batched_tokens {max_num_batched_tokens}")
    return prefill_ids


def _check_lora_slots(fail, plan: SchedulerOutput, lora: LoRAConfig | None) -> None:
    num_slots = 0 if lora is None else lora.max_loras
    for load in plan.lora_loads:
        if not 0 <= load.slot < num_slots:
            fail(f"LoRA load into slot {load.slot} outside [0, {num_slots})")
    for new in plan.scheduled_new_reqs:
        if not -1 <= new.lora_slot < num_slots:
            fail(f"request {new.req_id!r}: LoRA slot {new.lora_slot} outside "
                 f"[-1, {num_slots})")


def _check_new_request(fail, new, max_len: int, vocab_size: int, num_blocks: int,
                       max_blocks: int, after: dict[str, tuple[int, int, int]]) -> np.ndarray:
    """Check one new request; record its state after the plan in ``after``
    and return its prefill ids (``_token_ids``)."""
    prefill = len(new.prefill_token_ids)
    if not 0 < prefill <= max_len or len(new.prompt_token_ids) > prefill:
        fail(f"request {new.req_id!r} has {prefill} prefill tokens")
    ids = _token_ids(fail, new.req_id, new.prefill_token_ids, vocab_size)
    if not 0 <= new.num_computed_tokens <= prefill:
        fail(f"request {new.req_id!r}: bad num_computed_tokens {new.num_computed_tokens}")
    if problems := new.sampling.problems():
        fail(f"request {new.req_id!r}: {'; '.join(problems)}")
    held = _check_block_ids(fail, new.req_id, new.block_ids, num_blocks, 0, max_blocks)
    after[new.req_id] = (new.num_computed_tokens, held, prefill)
    return ids


def _token_ids(fail, req_id: str, token_ids: list[int], vocab_size: int) -> np.ndarray:
    """``token_ids`` (not empty) as int32, each checked to be in the
    vocabulary: at TP > 1 an id outside it would embed as zeros on every
    rank, silently. Converted once through int64, which holds any id the
    wire can carry but one past 2**63 (an OverflowError, refused alike)."""
    try:
        ids = np.array(token_ids, dtype=np.int64)
    except OverflowError:
        ids = None
    # Seen as unsigned, a negative id is above any vocabulary: one reduction.
    if ids is None or ids.view(np.uint64).max() >= vocab_size:
        fail(f"request {req_id!r}: token ids outside the vocabulary [0, {vocab_size})")
    return ids.astype(np.int32)


_NONE_HELD = np.zeros(0, dtype=np.int64)  # no cached request: none held, no prefill
_NONE_HELD.setflags(write=False)


def _cached_after(fail, cached, remaining: set[str], new_after: dict, states, block_tables,
                  num_blocks: int, max_blocks: int) -> tuple[list, np.ndarray, np.ndarray]:
    """Per cached request, in plan order, after the plan: (computed tokens,
    blocks held, prefill length). Ids are checked for the whole list at
    once, and only the requests with new blocks one by one; where an id is
    wrong, the requests are checked one by one in order, so the first
    problem is named as a per-request loop names it."""
    req_ids, host_counts = cached.req_ids, cached.num_computed_tokens
    if not req_ids:
        return [], _NONE_HELD, _NONE_HELD
    index = states.req_id_to_index
    if not (len(set(req_ids)) == len(req_ids) and remaining.issuperset(req_ids)
            and new_after.keys().isdisjoint(req_ids)):
        seen: set[str] = set()
        for req_id, blocks in zip(req_ids, cached.new_block_ids):
            if req_id not in remaining or req_id in new_after or req_id in seen:
                fail(f"unknown request {req_id!r}")
            seen.add(req_id)
            _check_block_ids(fail, req_id, blocks, num_blocks,
                             int(block_tables.num_blocks_np[index[req_id]]), max_blocks)
    slots = np.fromiter(map(index.__getitem__, req_ids), dtype=np.int64, count=len(req_ids))
    held = block_tables.num_blocks_np[slots].astype(np.int64)
    for i, blocks in enumerate(cached.new_block_ids):
        if blocks or held[i] > max_blocks:
            held[i] = _check_block_ids(fail, req_ids[i], blocks, num_blocks, int(held[i]),
                                       max_blocks)
    computed = (states.num_computed_tokens_np[slots].tolist() if host_counts is None
                else host_counts)
    return computed, held, states.prefill_len_np[slots].astype(np.int64)


_SAFE = 1 << 61  # counts within +-_SAFE add and compare in int64 without overflow


def _check_token_counts(fail, req_ids: list[str], counts: list[int], computed: list[int],
                        held: np.ndarray, prefill: np.ndarray, max_len: int, block_size: int,
                        num_speculative_tokens: int) -> None:
    """Check every request's scheduled token count against its state after
    the plan (per request in plan order). The
    checks run on arrays; the requests they flag, and any whose counts are
    too large for them, are then checked alone in order, the first that
    fails naming its problem."""
    try:
        n = np.array(counts, dtype=np.int64)
        c = np.array(computed, dtype=np.int64)
    except OverflowError:
        suspects = range(len(req_ids))
    else:
        bad = (n < 1) | (n > _SAFE) | (c > _SAFE) | (c < -_SAFE)
        bad |= (c >= prefill) & (n > 1 + num_speculative_tokens)
        bad |= c + n > np.minimum(max_len, held * block_size)
        suspects = np.flatnonzero(bad).tolist()
    for i in suspects:
        _check_request_tokens(fail, req_ids[i], counts[i], computed[i], int(held[i]),
                              int(prefill[i]), max_len, block_size, num_speculative_tokens)


def _check_request_tokens(fail, req_id: str, n: int, computed: int, held: int, prefill: int,
                          max_len: int, block_size: int, num_speculative_tokens: int) -> None:
    if n < 1:
        fail(f"request {req_id!r}: {n} scheduled tokens")
    if computed >= prefill and n > 1 + num_speculative_tokens:
        fail(f"request {req_id!r} decodes {n} tokens: at most 1 + "
             f"{num_speculative_tokens} drafts")
    if computed + n > min(max_len, held * block_size):
        fail(f"request {req_id!r}: tokens up to {computed + n} but KV room for "
             f"{held * block_size} (max_model_len {max_len})")


def _check_block_ids(fail, req_id: str, block_ids: list[list[int]] | None, num_blocks: int,
                     held: int, max_blocks_per_req: int) -> int:
    """Check a request's new block ids; returns the blocks it holds after."""
    block_ids = block_ids or []
    if len(block_ids) > 1:
        fail(f"request {req_id!r}: {len(block_ids)} KV cache groups, the runner has 1")
    group = block_ids[0] if block_ids else []
    if group and not 0 <= min(group) <= max(group) < num_blocks:
        for b in group:  # name the first one outside
            if not 0 <= b < num_blocks:
                fail(f"request {req_id!r}: block id {b} outside the cache [0, {num_blocks})")
    if held + len(group) > max_blocks_per_req:
        fail(f"request {req_id!r}: {held + len(group)} blocks exceed {max_blocks_per_req}")
    return held + len(group)
