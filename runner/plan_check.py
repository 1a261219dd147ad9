"""Checking a SchedulerOutput against the runner's state before applying it.

A plan that breaks the runner's invariants must fail with a clear error and
change nothing. Every rank holds the same state and receives the same plan,
so every rank reaches the same verdict before any collective: no rank can
crash while the others wait in an all-reduce.
"""

from __future__ import annotations

from ipc.errors import InvalidPlanError
from ipc.messages import SchedulerOutput


def check_plan(plan: SchedulerOutput, states, block_tables, num_blocks: int,
               max_num_batched_tokens: int, vocab_size: int) -> None:
    """Raise ``InvalidPlanError`` naming the first problem found.

    ``states`` is the runner's RequestState, ``block_tables`` its
    BlockTables; neither is changed.
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
    # Per request after the plan: (computed tokens, blocks held, prefill length).
    after: dict[str, tuple[int, int, int]] = {}
    for new in plan.scheduled_new_reqs:
        prefill = len(new.prefill_token_ids)
        if not 0 < prefill <= max_len or len(new.prompt_token_ids) > prefill:
            fail(f"request {new.req_id!r} has {prefill} prefill tokens")
        if min(new.prefill_token_ids) < 0 or max(new.prefill_token_ids) >= vocab_size:
            # At TP > 1 such an id would embed as zeros on every rank: silent.
            fail(f"request {new.req_id!r}: token ids outside the vocabulary [0, {vocab_size})")
        if not 0 <= new.num_computed_tokens <= prefill:
            fail(f"request {new.req_id!r}: bad num_computed_tokens {new.num_computed_tokens}")
        if problems := new.sampling.problems():
            fail(f"request {new.req_id!r}: {'; '.join(problems)}")
        held = _check_block_ids(fail, new.req_id, new.block_ids, num_blocks, 0, max_blocks)
        after[new.req_id] = (new.num_computed_tokens, held, prefill)
    cached = plan.scheduled_cached_reqs
    if len(cached.req_ids) != len(cached.new_block_ids):
        fail("cached request lists differ in length")
    for req_id, blocks in zip(cached.req_ids, cached.new_block_ids):
        if req_id not in remaining or req_id in after:  # each request is named once
            fail(f"unknown request {req_id!r}")
        slot = index[req_id]
        held = _check_block_ids(fail, req_id, blocks, num_blocks,
                                int(block_tables.num_blocks_np[slot]), max_blocks)
        after[req_id] = (int(states.num_computed_tokens_np[slot]), held,
                         int(states.prefill_len_np[slot]))
    req_ids = plan.scheduled_req_ids()
    if len(plan.num_scheduled_tokens) != len(req_ids):
        fail(f"{len(plan.num_scheduled_tokens)} token counts for {len(req_ids)} requests")
    total = 0
    for req_id, n in zip(req_ids, plan.num_scheduled_tokens):
        computed, held, _ = after[req_id]
        if n < 1:
            fail(f"request {req_id!r}: {n} scheduled tokens")
        if computed + n > min(max_len, held * block_tables.block_size):
            fail(f"request {req_id!r}: tokens up to {computed + n} but KV room for "
                 f"{held * block_tables.block_size} (max_model_len {max_len})")
        total += n
    if total > max_num_batched_tokens:
        fail(f"{total} tokens exceed max_num_batched_tokens {max_num_batched_tokens}")


def _check_block_ids(fail, req_id: str, block_ids: list[list[int]] | None, num_blocks: int,
                     held: int, max_blocks_per_req: int) -> int:
    """Check a request's new block ids; returns the blocks it holds after."""
    block_ids = block_ids or []
    if len(block_ids) > 1:
        fail(f"request {req_id!r}: {len(block_ids)} KV cache groups, the runner has 1")
    group = block_ids[0] if block_ids else []
    for b in group:
        if not 0 <= b < num_blocks:
            fail(f"request {req_id!r}: block id {b} outside the cache [0, {num_blocks})")
    if held + len(group) > max_blocks_per_req:
        fail(f"request {req_id!r}: {held + len(group)} blocks exceed {max_blocks_per_req}")
    return held + len(group)
