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
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from engine import prompt_logprobs
from engine.kv_cache_manager import KVCacheManager
from engine.min_tokens import min_tokens_stop_ids
from engine.outputs import Logprob, RequestOutputDelta, TokenLogprobs
from engine.request import Request, RequestStatus
from ipc.config import SchedulerConfig
from ipc.messages import (
    CachedRequestData,
    Logprobs,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)


@dataclass
class _StepDraft:
    """What one ``schedule`` call has decided so far: the plan it returns, in the making."""

    budget: int
    num_scheduled: dict[str, int] = field(default_factory=dict)
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_ids: list[str] = field(default_factory=list)
    cached_new_blocks: list[list[list[int]] | None] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    scheduled: list[Request] = field(default_factory=list)
    num_prompt_tokens: int = 0

    def take(self, request: Request, num_tokens: int) -> None:
        self.budget -= num_tokens
        self.num_scheduled[request.req_id] = num_tokens
        self.scheduled.append(request)
        start = request.num_computed_tokens
        self.num_prompt_tokens += max(0, min(start + num_tokens, request.num_prompt_tokens) - start)


@dataclass(frozen=True)
class _InFlight:
    """A request as one step scheduled it: the object, its incarnation
    (``num_preemptions`` then) and whether the step samples a token for it."""

    request: Request
    incarnation: int
    samples: bool


class _WaitingQueue:
    """Requests kept sorted by their policy key (stable for equal keys)."""

    def __init__(self) -> None:
        self._keys: list[tuple] = []
        self._reqs: list[Request] = []

    def push(self, request: Request, key: tuple) -> None:
        i = bisect.bisect(self._keys, key)
        self._keys.insert(i, key)
        self._reqs.insert(i, request)

    def peek(self) -> Request:
        return self._reqs[0]

    def pop_front(self) -> Request:
        self._keys.pop(0)
        return self._reqs.pop(0)

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
        self.requests: dict[str, Request] = {}
        self.waiting = _WaitingQueue()
        self.running: list[Request] = []
        self._finished_ids: set[str] = set()  # to report in the next SchedulerOutput
        self._keys: dict[str, tuple] = {}
        self._seq = itertools.count()
        self._in_flight: dict[int, dict[str, _InFlight]] = {}  # step id -> its requests
        self.step_id = 0
        self.num_preemptions = 0
        self.num_prompt_tokens = 0  # prompt tokens scheduled, all steps (stats)

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

    @property
    def num_running_reqs(self) -> int:
        return len(self.running)

    @property
    def num_waiting_reqs(self) -> int:
        return len(self.waiting)

    # -- one step -------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan the next step; see the module docstring for the rules."""
        draft = _StepDraft(budget=self.config.max_num_batched_tokens)
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
            ),
            # Cached requests were taken first, so the dict's order is the plan's.
            num_scheduled_tokens=list(draft.num_scheduled.values()),
            finished_req_ids=sorted(self._finished_ids),
            preempted_req_ids=draft.preempted,
        )
        self._finished_ids.clear()
        self.step_id += 1
        return out

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
            request.num_output_placeholders += samples
            in_flight[request.req_id] = _InFlight(request, request.num_preemptions, samples)
        return in_flight

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
            if num_new <= 0:
                i += 1
                continue
            new_blocks = self._allocate_or_preempt(request, num_new, draft)
            if new_blocks is None:
                return  # request itself was preempted: it was the last one
            draft.take(request, num_new)
            draft.cached_ids.append(request.req_id)
            draft.cached_new_blocks.append([new_blocks] if new_blocks else None)
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
        while self.waiting and draft.budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            # Prompt logprobs need every prompt position's logits: no prefix hits.
            hit_blocks, num_hit = (([], 0) if request.sampling_params.prompt_logprobs is not None
                                   else self.kv.get_computed_blocks(request))
            num_new = min(request.num_tokens - num_hit, draft.budget)
            if self.kv.allocate_slots(request, num_new, hit_blocks) is None:
                return
            self.waiting.pop_front()
            request.num_computed_tokens = num_hit
            if request.num_cached_tokens is None:
                request.num_cached_tokens = num_hit
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            draft.take(request, num_new)
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
        scheduled are discarded. Steps are absorbed in order, each once."""
        step_id = scheduler_output.step_id
        if runner_output.step_id != step_id:
            raise ValueError(
                f"runner output of step {runner_output.step_id} does not answer step {step_id}"
            )
        in_flight = self._in_flight.pop(step_id, None)
        if in_flight is None:
            raise ValueError(f"step {step_id} is not in flight (never scheduled, or absorbed)")
        deltas = []
        prompt_logprobs.absorb((e.request for e in in_flight.values() if self._is_live(e)),
                               runner_output.prompt_logprobs)
        rows = _logprob_rows(runner_output.logprobs)
        plan_req_ids = scheduler_output.scheduled_req_ids()
        sampled_rows = runner_output.rows()
        if len(sampled_rows) != len(plan_req_ids):
            raise ValueError(f"runner output of step {step_id} has {len(sampled_rows)} rows "
                             f"for {len(plan_req_ids)} scheduled requests")
        for req_id, sampled in zip(plan_req_ids, sampled_rows):
            token_rows = [next(rows, None) for _ in sampled]
            entry = in_flight.get(req_id)
            if entry is None or not self._is_live(entry):
                continue  # finished, aborted or preempted meanwhile
            request = entry.request
            request.num_output_placeholders -= entry.samples
            if sampled:  # empty for a prefill chunk
                deltas.append(self._append_tokens(request, sampled, token_rows))
        return deltas

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
            request.append_output_token(token)
            new_ids.append(token)
            status = self._stop_status(request, token)
            if status is not None:
                break
        if status is not None:
            self._finish(request, status)
        logprobs = None
        if request.sampling_params.logprobs is not None and None not in token_rows:
            logprobs = [_token_logprobs(t, row) for t, row in zip(new_ids, token_rows)]
        return RequestOutputDelta(
            request.req_id, new_ids, status is not None, request.finish_reason, logprobs,
            prompt_logprobs.take_ready(request), request.num_cached_tokens,
        )

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        """A sampled stop token wins over a length limit met by the same token."""
        params = request.sampling_params
        if len(request.output_token_ids) < params.min_tokens:
            # Stop tokens end nothing before min_tokens (the runner masks them).
            return (RequestStatus.FINISHED_LENGTH
                    if request.num_tokens >= self.config.max_model_len else None)
        if token in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if not params.ignore_eos and token in request.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if len(request.output_token_ids) >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
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


def _token_logprobs(token: int, row: tuple) -> TokenLogprobs:
    top_ids, top_lps, sampled_lp, sampled_rank = row
    out = {t: Logprob(lp, rank) for rank, (t, lp) in enumerate(zip(top_ids, top_lps), start=1)}
    out[token] = Logprob(sampled_lp, sampled_rank)
    return out
