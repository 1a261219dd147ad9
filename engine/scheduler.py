"""The scheduler: which requests run in the next step, and how many tokens.

One token budget per step (``max_num_batched_tokens``). Running requests
come first, in policy order; each gets the tokens it still lacks, capped by
what is left of the budget (so a long prefill is chunked over steps). Then
waiting requests are admitted in policy order while budget, ``max_num_seqs``
and free KV blocks allow. When a running request cannot get blocks, the
lowest-ranked running request not yet scheduled this step is preempted by
recompute: its blocks are freed, it returns to the waiting queue, which is
kept in policy order (under fcfs it goes ahead of every request that
arrived after it: the front, in practice), and later comes back to the
runner as a new request whose prefill is prompt + the tokens generated so
far. A step that preempts admits no waiting request. Preemption always
takes the lowest-ranked request, so the highest-ranked one always
progresses; ``add_request`` rejects a request that could not finish even
with the whole cache to itself, so no request is preempted forever.

Invariants of every ``SchedulerOutput``: ``total_num_scheduled_tokens <=
max_num_batched_tokens``; at most ``max_num_seqs`` requests are running; no
request is scheduled past ``max_model_len``; no request id is both in
``finished_req_ids`` and scheduled, nor both preempted and scheduled.
``finished_req_ids`` may name requests the runner never saw (aborted while
waiting); the runner ignores those.

Async scheduling. ``num_computed_tokens`` advances when tokens are
scheduled, as in vLLM, so step N+1 may be scheduled before step N's output
is absorbed. A step that will sample a token for a request counts one
placeholder in ``Request.num_output_placeholders`` until its output
arrives; the next step feeds that token at position ``num_tokens +
placeholders - 1`` and the runner reads it from the device. The scheduler
does not know which mode the engine runs: synchronous scheduling is just
``update_from_output`` before every ``schedule``. The rules that keep both
modes equal:

- at most one step is unabsorbed when ``schedule`` runs (the engine keeps
  at most two in flight), so a running request then has
  ``num_computed_tokens <= num_tokens``: every token the KV cache manager
  hashes is known;
- a request whose pending placeholders already reach ``max_tokens`` or
  ``max_model_len`` is not scheduled again: the output never overshoots;
- each step remembers which request incarnation it scheduled; its output
  for a request that finished (eos, stop, length, abort) or was preempted
  since is discarded, so a request is reported finished once, and a
  preempted request comes back with prompt + the outputs known then.

Speculative decoding (``num_speculative_tokens`` k > 0). A request that
decodes (its computed tokens reach the prefill it was admitted with) is
scheduled for 1 + d tokens, d = min(k, what ``max_tokens``,
``max_model_len``, ``draft_max_model_len`` and the budget leave) drafts, which the runner holds on the device; KV blocks are allocated
for all 1 + d (no drafts at all while ``spec_disable_by_batch_size`` or more
requests run). A draft model of fewer positions than ``max_model_len`` sets
``draft_max_model_len``: no draft sits at a position at or past it, so a
request nearing it gets fewer drafts, then none, and decodes on without
them (its output unchanged: drafts only ever save steps). The
scheduler never knows a step's accepted count before its output, so it is
optimistic: scheduling counts every draft as accepted
(``num_computed_tokens += 1 + d``, ``num_output_placeholders += 1 + d``),
and the output corrects both: a row that emits a + 1 tokens (a accepted
drafts) gives back the 1 + d placeholders and d - a computed tokens (the
rejected positions, rewritten by a later step). Between the two, host
counts are upper bounds: the runner takes positions, slot mappings and
attention lengths from its device counts (the truth, corrected on the
device), and the KV reserved for the optimistic count covers the true one.
With async scheduling the next step is scheduled with the optimistic count
(a decode again asks for one token plus drafts); the rules above hold
unchanged, ``max_tokens`` counts placeholders optimistically (a request may
wait a step near its end, never overshoot), and the prefix cache registers
only blocks below both ``num_computed_tokens`` and ``num_tokens``, so never
a block holding an unverified token. Stop tokens and ``max_tokens`` inside
an accepted run cut it there (``_append_tokens``).

Structured outputs. A request with a ``grammar`` (its matcher) is listed in
the plan's ``structured_output_req_ids`` when the step samples for it; the
engine sends that step's bitmask after the plan. So is a request with a
``thinking_budget`` in the steps any of whose tokens it may force (the
message forces it, ``engine.thinking_budget``); it takes drafts, and the
workers find which of its rows the budget forces from the budget's state
and the drafts. A request with a grammar takes drafts too: each step's
output carries the drafts the runner proposed for its next step
(``Request.next_drafts``), and that step's bitmask has a row per position
it verifies, the grammar after the drafts before it
(``StructuredOutputManager.start_bitmask``; filled once the step before
is absorbed, so the drafts and every accepted token are known); with a
thinking budget too, the rows its budget forces allow every token. Each
appended token
advances the matcher (only appended tokens do, so the matcher always matches
``output_token_ids``, across preemptions too); a completed grammar finishes
the request with "stop". A token the grammar refuses (every token the
grammar allows was masked too, by ``bad_words``, ``allowed_token_ids`` or a
``logit_bias``, so the sampler took one it does not allow) is not appended:
the request ends with vLLM's finish reason for it, "error", and its output
holds only tokens the grammar accepted.

LoRA adapters (``max_loras`` > 0). A waiting request with an adapter is
admitted only once its adapter has one of the workers' ``max_loras``
adapter slots (``engine.lora_slots``): held already, empty, or reloaded
from an adapter no running request uses (the plan's ``lora_loads``). One
that finds none is skipped and keeps its place while later requests are
admitted (vLLM's rule), so the running requests never hold more than
``max_loras`` distinct adapters. The workers read an adapter's files each
time it takes a slot, so before a plan reloads one, ``lora_readable``
(the engine's) reads its files again: a request whose adapter's folder is
gone or changed into one the engine cannot serve since its check is not
admitted but ends with finish reason "error" (its last delta comes with
the step's, ``take_unadmitted``), where the workers' read would stop the
engine.

Prompt logprobs. A request that asks for them takes no prefix-cache hits
(every prompt position's logits are needed), and a step scores at most
``prompt_logprobs.ENTRIES_PER_STEP`` entries: its scored prompt positions
times the widest ``prompt_logprob_width`` among them (the runner computes
every scored row that wide). A prefill chunk is cut to what fits
(``_StepDraft.scorable``); a request that does not fit at all waits for
the next step, except that a step scoring nothing yet takes one position,
so every request progresses. With a few top entries this never binds
before the token budget does; with the whole vocabulary it prefills in
chunks of a few positions (``engine/prompt_logprobs.py`` gives the costs).

Token-level pooling. The runner's reply carries a row for every scheduled
token of a token-level pooling request ("token_embed", "token_classify"),
so a step holds at most ``ipc.serde.MAX_POOLED_BYTES`` of them
(``_StepDraft.pooled_rows_left``, rows of ``pooled_size`` float32 values):
such a request's chunk is cut to what is left, and one left nothing waits
for the next step. The engine refuses a request whose rows alone pass it
(``check_pooled_rows``), so a whole prompt always fits a fresh step.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from engine import prompt_logprobs, repetition
from engine.classify_head import probabilities_of
from engine.kv_cache_manager import KVCacheManager
from engine.lora_slots import LoRASlots
from engine.min_tokens import min_tokens_stop_ids
from engine.outputs import Logprob, RequestOutputDelta, TokenLogprobs
from engine.pooling_params import embedding_of
from engine.reported_drafts import checked_drafts
from engine.reported_pooled import checked_pooled
from engine.request import Request, RequestStatus
from ipc import serde
from ipc.config import SchedulerConfig
from ipc.lora_request import LoRARequest
from ipc.messages import (
    CachedRequestData,
    Logprobs,
    LoRALoad,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)

logger = logging.getLogger(__name__)


@dataclass
class _StepDraft:
    """What one ``schedule`` call has decided so far: the plan it returns, in the making."""

    budget: int
    num_scheduled: dict[str, int] = field(default_factory=dict)
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_ids: list[str] = field(default_factory=list)
    cached_new_blocks: list[list[list[int]] | None] = field(default_factory=list)
    cached_computed: list[int] = field(default_factory=list)  # speculative decoding only
    preempted: list[str] = field(default_factory=list)
    scheduled: list[Request] = field(default_factory=list)
    num_drafts: dict[str, int] = field(default_factory=dict)
    num_prompt_tokens: int = 0
    # Prompt positions the step scores (prompt logprobs), and the widest
    # entry count among them: the runner computes every row that wide.
    scored_rows: int = 0
    scored_width: int = 0
    lora_loads: list[LoRALoad] = field(default_factory=list)
    # Token-level pooling rows the step's reply may still carry.
    pooled_rows_left: int = 0

    def take(self, request: Request, num_tokens: int, num_drafts: int = 0) -> None:
        self.budget -= num_tokens
        if request.pools_tokens:
            self.pooled_rows_left -= num_tokens
        self.num_scheduled[request.req_id] = num_tokens
        if num_drafts:
            self.num_drafts[request.req_id] = num_drafts
        self.scheduled.append(request)
        start = request.num_computed_tokens
        self.num_prompt_tokens += max(0, min(start + num_tokens, request.num_prompt_tokens) - start)
        if (scored := _scored(request, num_tokens)) > 0:
            self.scored_rows += scored
            self.scored_width = max(self.scored_width, request.prompt_logprob_width)

    def scorable(self, request: Request, num_tokens: int) -> int:
        """``num_tokens``, or fewer so that the prompt positions they score
        keep the step within ``ENTRIES_PER_STEP`` prompt-logprob entries
        (rows times the widest width, as the runner computes them); 0 when
        none fits. A step that scores nothing yet takes one position at
        least, so every request progresses."""
        if _scored(request, num_tokens) == 0:
            return num_tokens
        width = max(self.scored_width, request.prompt_logprob_width)
        room = prompt_logprobs.ENTRIES_PER_STEP // width - self.scored_rows
        if self.scored_rows == 0:
            room = max(room, 1)
        return num_tokens if _scored(request, num_tokens) <= room else max(room, 0)


def _scored(request: Request, num_tokens: int) -> int:
    """The prompt positions ``num_tokens`` more tokens of ``request`` score:
    those below its last prompt token (whose logprob is the next token's),
    for a request that asks for prompt logprobs."""
    if request.prompt_logprob_width == 0:
        return 0
    start = request.num_computed_tokens
    return max(0, min(start + num_tokens, request.num_prompt_tokens - 1) - start)


@dataclass(frozen=True)
class _InFlight:
    """A request as one step scheduled it: the object, its incarnation
    (``num_preemptions`` then), whether the step samples a token for it and
    the drafts it verifies."""

    request: Request
    incarnation: int
    samples: bool
    num_drafts: int = 0


@dataclass
class SpecDecodingStats:
    """Speculative decoding counters over every absorbed step (vLLM's
    names): rows that verified drafts, drafts verified, drafts accepted, and
    accepted drafts by position (index j: the (j+1)-th draft of a row)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for j in range(num_accepted):
            self.num_accepted_tokens_per_pos[j] += 1


class _WaitingQueue:
    """Requests kept sorted by their policy key (stable for equal keys)."""

    def __init__(self) -> None:
        self._keys: list[tuple] = []
        self._reqs: list[Request] = []

    def push(self, request: Request, key: tuple) -> None:
        i = bisect.bisect(self._keys, key)
        self._keys.insert(i, key)
        self._reqs.insert(i, request)

    def peek(self, i: int = 0) -> Request:
        return self._reqs[i]

    def pop(self, i: int = 0) -> Request:
        """The request ``i`` places from the front (0: the front), removed."""
        self._keys.pop(i)
        return self._reqs.pop(i)

    def remove(self, request: Request) -> bool:
        for i, r in enumerate(self._reqs):
            if r is request:
                del self._keys[i], self._reqs[i]
                return True
        return False

    def __len__(self) -> int:
        return len(self._reqs)

    def __iter__(self):
        return iter(self._reqs)


class Scheduler:
    """Owns the requests and the KV blocks; plans steps, absorbs results."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.kv = KVCacheManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        # The workers' adapter slots (LoRA serving; None when off).
        self.lora_slots = LoRASlots(config.max_loras) if config.max_loras else None
        # Whether an adapter's files can still be served (the engine sets it;
        # None: not asked), and the last deltas of requests it refused.
        self.lora_readable: Callable[[LoRARequest], bool] | None = None
        self._unadmitted: list[RequestOutputDelta] = []
        self.requests: dict[str, Request] = {}
        self.waiting = _WaitingQueue()
        self.running: list[Request] = []
        self._finished_ids: set[str] = set()  # to report in the next SchedulerOutput
        self._keys: dict[str, tuple] = {}
        self._seq = itertools.count()
        self._in_flight: dict[int, dict[str, _InFlight]] = {}  # step id -> its requests
        # step id -> the requests whose next drafts its bitmask asked for
        self._drafts_asked: dict[int, list[str]] = {}
        self.step_id = 0
        self.num_preemptions = 0
        self.num_prompt_tokens = 0  # prompt tokens scheduled, all steps (stats)
        self._prefill_lens: dict[str, int] = {}  # tokens fed as prefill at admission
        self.spec_stats = SpecDecodingStats(
            num_accepted_tokens_per_pos=[0] * config.num_speculative_tokens)

    # -- requests in and out ------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a request, checked where it entered the engine
        (``check_request``); ``ValueError`` for an id already in use."""
        self._check_id(request.req_id)
        seq = next(self._seq)
        if self.config.policy == "priority":
            self._keys[request.req_id] = (request.priority, request.arrival_time, seq)
        else:
            self._keys[request.req_id] = (request.arrival_time, seq)
        request.status = RequestStatus.WAITING
        request.queued_ts = time.monotonic()
        self.requests[request.req_id] = request
        self.waiting.push(request, self._keys[request.req_id])

    def _check_id(self, rid: str) -> None:
        if rid in self.requests or rid in self._finished_ids:
            raise ValueError(f"request id {rid!r} is already in use; request ids must be unique")

    def abort_requests(self, req_ids: str | Iterable[str]) -> None:
        """Finish running or waiting requests as "abort" and free their
        blocks; unknown or already finished ids are ignored."""
        if isinstance(req_ids, str):
            req_ids = (req_ids,)
        for rid in req_ids:
            request = self.requests.get(rid)
            if request is not None:
                self._finish(request, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    def take_unadmitted(self) -> list[RequestOutputDelta]:
        """The last deltas of the requests ended at admission since the last
        call (an adapter that can no longer be read: module docstring)."""
        taken, self._unadmitted = self._unadmitted, []
        return taken

    @property
    def num_running_reqs(self) -> int:
        return len(self.running)

    @property
    def num_waiting_reqs(self) -> int:
        return len(self.waiting)

    # -- one step -------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan the next step; see the module docstring for the rules."""
        row_bytes = max(self.config.pooled_size, 1) * 4
        draft = _StepDraft(budget=self.config.max_num_batched_tokens,
                           pooled_rows_left=serde.MAX_POOLED_BYTES // row_bytes)
        self.running.sort(key=lambda r: self._keys[r.req_id])
        self._schedule_running(draft)
        if not draft.preempted:
            self._schedule_waiting(draft)
        self._in_flight[self.step_id] = self._advance(draft)
        self.num_prompt_tokens += draft.num_prompt_tokens
        out = SchedulerOutput(
            step_id=self.step_id,
            scheduled_new_reqs=draft.new_reqs,
            scheduled_cached_reqs=CachedRequestData(
                req_ids=draft.cached_ids,
                new_block_ids=draft.cached_new_blocks,
                num_computed_tokens=draft.cached_computed
                if self.config.num_speculative_tokens else None,
            ),
            # Cached requests were taken first, so the dict's order is the plan's.
            num_scheduled_tokens=list(draft.num_scheduled.values()),
            finished_req_ids=sorted(self._finished_ids),
            preempted_req_ids=draft.preempted,
            lora_loads=draft.lora_loads,
            structured_output_req_ids=[
                req_id for req_id, entry in self._in_flight[self.step_id].items()
                if entry.samples and (entry.request.grammar is not None
                                      or (entry.request.thinking_budget is not None
                                          and _may_force(entry.request)))],
        )
        self._finished_ids.clear()
        self.step_id += 1
        return out

    def step_drafts(self, step_id: int) -> dict[str, int]:
        """The drafts step ``step_id`` (scheduled, not absorbed yet) verifies,
        per request that has any."""
        return {req_id: entry.num_drafts for req_id, entry in self._in_flight[step_id].items()
                if entry.num_drafts}

    def expect_drafts(self, step_id: int, req_ids: list[str]) -> None:
        """Step ``step_id``'s bitmask, sent before its output is absorbed,
        asked the runner for the next drafts of ``req_ids``
        (``GrammarBitmask.draft_req_ids``): its output must report exactly
        theirs (``update_from_output``; without this call, none)."""
        self._drafts_asked[step_id] = list(req_ids)

    def _advance(self, draft: _StepDraft) -> dict[str, _InFlight]:
        """Move each scheduled request's ``num_computed_tokens`` past this
        step's tokens; a request whose tokens reach its end gets a placeholder
        for the token the step samples."""
        in_flight = {}
        for request in draft.scheduled:
            request.num_computed_tokens += draft.num_scheduled[request.req_id]
            samples = (
                request.num_computed_tokens
                >= request.num_tokens + request.num_output_placeholders
            )
            num_drafts = draft.num_drafts.get(request.req_id, 0)
            request.num_output_placeholders += samples * (1 + num_drafts)
            in_flight[request.req_id] = _InFlight(request, request.num_preemptions, samples,
                                                  num_drafts)
        return in_flight

    def _num_drafts(self, request: Request, budget: int) -> int:
        """Drafts for a request about to decode one token: 0 unless it is
        past the prefill it was admitted with; at most what ``max_tokens``,
        ``max_model_len`` and ``budget`` leave room for (every draft could
        be accepted). With T tokens known or in
        flight, the step feeds the last at position T - 1 and the drafts at
        T .. T + d - 1, each below ``draft_max_model_len``: d <= that - T. The
        draft model made draft j at position T - 1 + j, so below it too; T
        counts in-flight drafts as accepted, so the true positions are no
        higher."""
        k = self.config.num_speculative_tokens
        if k == 0:
            return 0
        limit = self.config.spec_disable_by_batch_size
        if limit and len(self.running) >= limit:
            return 0
        if request.num_computed_tokens < self._prefill_lens.get(request.req_id, 1 << 62):
            return 0
        pending = request.num_output_placeholders
        room_output = request.max_tokens - (len(request.output_token_ids) + pending) - 1
        room_length = self.config.max_model_len - (request.num_tokens + pending) - 1
        room_draft = self.config.draft_max_model_len - (request.num_tokens + pending)
        return max(0, min(k, room_output, room_length, room_draft, budget))

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        if self._ends_by_length(request):
            return 0
        wanted = request.num_tokens + request.num_output_placeholders
        room = self.config.max_model_len - request.num_computed_tokens
        return min(wanted - request.num_computed_tokens, budget, room)

    def _ends_by_length(self, request: Request) -> bool:
        """The tokens known plus those in flight reach ``max_tokens`` or
        ``max_model_len``: one more step would sample past the end."""
        pending = request.num_output_placeholders
        if pending == 0:
            return False
        return (
            len(request.output_token_ids) + pending >= request.max_tokens
            or request.num_tokens + pending >= self.config.max_model_len
        )

    def _schedule_running(self, draft: _StepDraft) -> None:
        i = 0
        while i < len(self.running) and draft.budget > 0:
            request = self.running[i]
            num_new = self._num_new_tokens(request, draft.budget)
            if request.prompt_logprob_width:  # the common case pays nothing more
                num_new = draft.scorable(request, num_new)
            if request.pools_tokens:
                num_new = min(num_new, draft.pooled_rows_left)
            if num_new <= 0:
                i += 1
                continue
            num_drafts = self._num_drafts(request, draft.budget - 1) if num_new == 1 else 0
            num_new += num_drafts
            new_blocks = self._allocate_or_preempt(request, num_new, draft)
            if new_blocks is None:
                return  # request itself was preempted: it was the last one
            draft.take(request, num_new, num_drafts)
            draft.cached_ids.append(request.req_id)
            draft.cached_new_blocks.append([new_blocks] if new_blocks else None)
            draft.cached_computed.append(request.num_computed_tokens)
            i += 1

    def _allocate_or_preempt(
        self, request: Request, num_new: int, draft: _StepDraft
    ) -> list[int] | None:
        """Blocks for ``num_new`` more tokens, preempting from the back of
        ``running`` (lowest rank, not yet scheduled) until they fit. None if
        ``request`` itself had to go."""
        while True:
            new_blocks = self.kv.allocate_slots(request, num_new)
            if new_blocks is not None:
                return new_blocks
            victim = self.running.pop()
            self._preempt(victim)
            draft.preempted.append(victim.req_id)
            if victim is request:
                return None

    def _schedule_waiting(self, draft: _StepDraft) -> None:
        """Admit waiting requests in policy order while the budget, the
        request slots and the KV blocks allow; the first that does not fit
        ends the admissions. A request whose LoRA adapter can get no
        adapter slot (``LoRASlots``: every slot's adapter is in use) is
        skipped and keeps its place, as in vLLM."""
        in_use = ({r.lora_request.lora_int_id for r in self.running if r.lora_request}
                  if self.lora_slots is not None else set())
        skipped = 0
        while (len(self.waiting) > skipped and draft.budget > 0
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting.peek(skipped)
            lora = request.lora_request
            if lora is not None and not self.lora_slots.can_take(lora, in_use):
                skipped += 1
                continue
            if (lora is not None and self.lora_readable is not None
                    and self.lora_slots.slot_of(lora.lora_int_id) is None
                    and not self.lora_readable(lora)):
                self._finish(request, RequestStatus.FINISHED_ERROR)
                self._unadmitted.append(RequestOutputDelta(request.req_id, [], True,
                                                           request.finish_reason))
                continue
            hit_blocks, num_hit = (self.kv.get_computed_blocks(request)
                                   if request.reads_prefix_cache else ([], 0))
            num_new = draft.scorable(request, min(request.num_tokens - num_hit, draft.budget))
            if request.pools_tokens:
                num_new = min(num_new, draft.pooled_rows_left)
            if not self.config.enable_chunked_prefill and num_new < request.num_tokens - num_hit:
                return  # whole prompts only: it waits for a step with room
            if num_new <= 0 or self.kv.allocate_slots(request, num_new, hit_blocks) is None:
                return
            self.waiting.pop(skipped)
            self._prefill_lens[request.req_id] = request.num_tokens
            request.num_computed_tokens = num_hit
            if request.num_cached_tokens is None:
                request.num_cached_tokens = num_hit
                request.scheduled_ts = time.monotonic()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            draft.take(request, num_new)
            lora_slot = -1
            if lora is not None:
                lora_slot, load = self.lora_slots.acquire(lora, in_use)
                in_use.add(lora.lora_int_id)
                if load is not None:
                    draft.lora_loads.append(load)
            draft.new_reqs.append(
                NewRequestData(
                    req_id=request.req_id,
                    prompt_token_ids=list(request.prompt_token_ids),
                    prefill_token_ids=list(request.all_token_ids),
                    sampling=request.sampling_params.to_options(),
                    block_ids=[self.kv.get_block_ids(request.req_id)],
                    num_computed_tokens=num_hit,
                    max_tokens=request.max_tokens,
                    min_tokens_stop_ids=min_tokens_stop_ids(request),
                    lora_slot=lora_slot,
                    pooling_task=request.pooling_task,
                )
            )

    def _free_blocks(self, request: Request) -> None:
        # The KV cache manager caches the full blocks below
        # num_computed_tokens by their tokens; a placeholder's is not known.
        request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens)
        self.kv.free(request)

    def _preempt(self, request: Request) -> None:
        """Free the request's blocks and queue it again; a token in flight
        for it is discarded when its step's output arrives."""
        self._free_blocks(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0
        request.next_drafts = []
        request.pooled_chunks = []
        if request.grammar is not None:
            request.grammar.rollback_to(len(request.output_token_ids))
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push(request, self._keys[request.req_id])

    # -- results ----------------------------------------------------------------

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[RequestOutputDelta]:
        """Append each request's sampled tokens, stop it at the first token
        that meets a stop condition (later ones are dropped), free finished
        requests' blocks. One delta per request that got tokens. Tokens of
        requests that finished or were preempted after the step was
        scheduled are discarded. Steps are absorbed in order, each once.
        A reply that breaks the runner's contract (another step's, rows that
        do not match the plan's requests, drafts other than those asked
        for: ``reported_drafts``, pooled vectors other than those of the
        pooling requests whose prompt ended: ``reported_pooled``) is a
        ``ValueError`` naming the fault,
        raised before the reply changes any request (its prompt logprobs
        included)."""
        step_id = scheduler_output.step_id
        drafts_asked = self._drafts_asked.pop(step_id, [])
        if runner_output.step_id != step_id:
            raise ValueError(
                f"runner output of step {runner_output.step_id} does not answer step {step_id}"
            )
        in_flight = self._in_flight.pop(step_id, None)
        if in_flight is None:
            raise ValueError(f"step {step_id} is not in flight (never scheduled, or absorbed)")
        deltas = []
        rows = _logprob_rows(runner_output.logprobs)
        plan_req_ids = scheduler_output.scheduled_req_ids()
        sampled_rows = runner_output.rows()
        if len(sampled_rows) != len(plan_req_ids):
            raise ValueError(f"runner output of step {step_id} has {len(sampled_rows)} rows "
                             f"for {len(plan_req_ids)} scheduled requests")
        next_drafts = checked_drafts(step_id, runner_output.next_draft_token_ids, drafts_asked,
                                     self.config.num_speculative_tokens, self.config.vocab_size)
        if self.config.pooled_size or runner_output.pooled:  # a generating step: neither
            checked_pooled(step_id, runner_output.pooled,
                           _pooled_rows(in_flight, plan_req_ids,
                                        scheduler_output.num_scheduled_tokens),
                           self.config.pooled_size)
        # Only a reply that passed every check above changes a request.
        prompt_logprobs.absorb((e.request for e in in_flight.values() if self._is_live(e)),
                               runner_output.prompt_logprobs)
        for req_id, sampled in zip(plan_req_ids, sampled_rows):
            token_rows = [next(rows, None) for _ in sampled]
            entry = in_flight.get(req_id)
            if entry is None or not self._is_live(entry):
                continue  # finished, aborted or preempted meanwhile
            request = entry.request
            if req_id in next_drafts:
                request.next_drafts = next_drafts[req_id]
            request.num_output_placeholders -= entry.samples * (1 + entry.num_drafts)
            if entry.num_drafts:
                num_accepted = len(sampled) - 1
                request.num_computed_tokens -= entry.num_drafts - num_accepted
                self.spec_stats.observe(entry.num_drafts, num_accepted)
            if request.pooling_params is not None:
                if request.pools_tokens:
                    request.pooled_chunks.append(runner_output.pooled[req_id])
                if entry.samples:
                    deltas.append(self._finish_pooled(request, runner_output.pooled[req_id]))
            elif sampled:  # empty for a prefill chunk
                deltas.append(self._append_tokens(request, sampled, token_rows))
        return deltas

    def _finish_pooled(self, request: Request, pooled: bytes) -> RequestOutputDelta:
        """A pooling request whose prompt has run: its embedding or class
        probabilities (the request's head over the runner's vector, or over
        its rows of every chunk for a token-level request: ``embedding_of``
        or ``probabilities_of`` with the classifier's activation, by its
        task), and it finishes "stop" with its blocks freed, as vLLM
        finishes it."""
        self._finish(request, RequestStatus.FINISHED_STOPPED)
        params = request.pooling_params
        num_rows = 1
        if request.pools_tokens:
            pooled, num_rows = b"".join(request.pooled_chunks), request.num_prompt_tokens
            request.pooled_chunks = []
        if params.task in ("classify", "token_classify"):
            output = probabilities_of(pooled, params, self.config.classifier_activation,
                                      num_rows)
        else:
            output = embedding_of(pooled, params, num_rows)
        return RequestOutputDelta(request.req_id, [], True, request.finish_reason,
                                  num_cached_tokens=request.num_cached_tokens,
                                  pooled=output)

    def _is_live(self, entry: _InFlight) -> bool:
        request = entry.request
        return (
            self.requests.get(request.req_id) is request
            and request.num_preemptions == entry.incarnation
        )

    def _append_tokens(
        self, request: Request, sampled: list[int], token_rows: list[tuple | None]
    ) -> RequestOutputDelta:
        new_ids: list[int] = []
        status = None
        for token in sampled:
            if not self._grammar_accepts(request, token):
                status = RequestStatus.FINISHED_ERROR
                break
            request.append_output_token(token)
            new_ids.append(token)
            status = self._grammar_status(request) or self._stop_status(request, token)
            if status is not None:
                break
        if status is not None:
            self._finish(request, status)
        logprobs = None
        if request.sampling_params.num_logprobs is not None and None not in token_rows:
            logprobs = [_token_logprobs(t, row) for t, row in zip(new_ids, token_rows)]
        params, last = request.sampling_params, new_ids[-1] if new_ids else None
        stopped = status == RequestStatus.FINISHED_STOPPED
        # End of sequence first, as ``_stop_status`` and vLLM check it.
        on_eos = stopped and not params.ignore_eos and last in request.eos_token_ids
        on_stop_id = stopped and not on_eos and last in request.stop_token_ids
        return RequestOutputDelta(
            request.req_id, new_ids, status is not None, request.finish_reason, logprobs,
            prompt_logprobs.take_ready(request), request.num_cached_tokens,
            hides_stop_token=(on_eos or on_stop_id) and not params.include_stop_str_in_output,
            stop_reason=(last if on_stop_id else repetition.STOP_REASON
                         if status == RequestStatus.FINISHED_REPETITION else None),
        )

    def _grammar_accepts(self, request: Request, token: int) -> bool:
        """Advance the request's grammar by ``token``, if it has one; False
        (after one error line) if the grammar refuses it."""
        grammar = request.grammar
        if grammar is None or grammar.accept(token):
            return True
        logger.error("request %s: the grammar refused token %d (%s): ending the request with "
                     "finish reason 'error'", request.req_id, token, grammar.error())
        return False

    def _grammar_status(self, request: Request) -> RequestStatus | None:
        """"stop" once the request's grammar is complete."""
        grammar = request.grammar
        if grammar is not None and grammar.is_terminated():
            return RequestStatus.FINISHED_STOPPED
        return None

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        """A sampled stop token wins over a length limit met by the same token,
        and both over a repetition it completes (vLLM's order)."""
        params = request.sampling_params
        if len(request.output_token_ids) < params.min_tokens:
            # Stop tokens end nothing before min_tokens (the runner masks them).
            return (RequestStatus.FINISHED_LENGTH
                    if request.num_tokens >= self.config.max_model_len else None)
        if token in request.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if not params.ignore_eos and token in request.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if len(request.output_token_ids) >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        if request.repetition is not None and request.repetition.repeating:
            return RequestStatus.FINISHED_REPETITION
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._free_blocks(request)
        request.status = status
        del self.requests[request.req_id]
        del self._keys[request.req_id]
        self._prefill_lens.pop(request.req_id, None)
        self._finished_ids.add(request.req_id)


def _logprob_rows(logprobs: Logprobs | None) -> Iterator[tuple]:
    """One row per sampled token, in the order of the runner output's
    requests and their tokens: (top ids, top logprobs, sampled logprob,
    sampled rank). Empty when the runner sent no logprobs."""
    if logprobs is None:
        return iter(())
    return zip(
        logprobs.top_token_ids,
        logprobs.top_logprobs,
        logprobs.sampled_logprobs,
        logprobs.sampled_ranks,
    )


def _may_force(request: Request) -> bool:
    """Whether a token a step samples for ``request`` (scheduled, with its
    1 + d placeholders) may be forced by its thinking budget: the tokens
    before its last row still in flight (those of earlier steps, counted
    with every draft accepted, and the step's own d drafts) may spend what
    is left."""
    budget = request.thinking_budget
    return budget is not None and budget.may_force(request.num_output_placeholders - 1)


def _token_logprobs(token: int, row: tuple) -> TokenLogprobs:
    top_ids, top_lps, sampled_lp, sampled_rank = row
    out = {t: Logprob(lp, rank) for rank, (t, lp) in enumerate(zip(top_ids, top_lps), start=1)}
    out[token] = Logprob(sampled_lp, sampled_rank)
    return out


def _pooled_rows(in_flight: dict[str, _InFlight], plan_req_ids: list[str],
                 num_scheduled: list[int]) -> dict[str, int]:
    """The rows a pooling step's reply owes each request
    (``reported_pooled``): one for a sequence pooling request whose prompt
    ends in the step, its scheduled tokens for a token-level one."""
    rows = {}
    for req_id, n in zip(plan_req_ids, num_scheduled):
        entry = in_flight.get(req_id)
        if entry is None or entry.request.pooling_params is None:
            continue
        if entry.request.pools_tokens:
            rows[req_id] = n
        elif entry.samples:
            rows[req_id] = 1
    return rows
