"""The engine's side of structured outputs: compile, attach, fill the bitmask.

``check`` (when a request enters the engine) compiles its constraint, or
finds it compiled, and raises ``GrammarError`` with the backend's message when
it does not compile (in time): nothing of a bad request reaches the workers.
``new_grammar`` gives an accepted request its own matcher; under a
reasoning parser (``reasoning``, the tags' ids) one whose output begins
inside its reasoning (``Request.starts_in_reasoning``, the engine's
decision) is held only from the end of its reasoning on (``Grammar``), as
vLLM's structured-output manager holds it.
``start_bitmask(plan, requests)`` fills the rows of a step's
``structured_output_req_ids`` from their matchers, all at once in
llguidance's threads, started from a fill thread of its own (llguidance
drops the GIL for the whole fill), so the engine loop goes on meanwhile:
with async scheduling the engine starts the fill of step N+1 as soon as it
has absorbed step N, then schedules and sends step N+2's plan, and sends
N+1's bitmask (``PendingBitmask.result()``) after that. While a fill runs,
llguidance holds its matchers: nothing may consume, roll back or query
them until ``result()`` has returned (the engine's order guarantees it).
``bitmask`` is the same fill on the calling thread (synchronous scheduling).
One persistent buffer holds the rows being filled (no allocation a step);
``result()`` copies them into the message.

With speculative decoding a request with a grammar and d drafts in the
step has 1 + d rows (``GrammarBitmask.num_rows``): row i is its grammar's
mask after its tokens and its drafts 1..i (``Request.next_drafts``, which
the output of the step before brought; llguidance consumes, fills and
rolls back, in its threads). Every row starts allowing every token, and
the walk stops at a draft the grammar refuses or one after its end: the
runner masks that draft out of the row before it, so the rejection
sampler rejects it there and never uses the rows after. The message names
the requests with a grammar (``draft_req_ids``), whose drafts for the
next step the step's output then carries.

A drafted request with both a grammar and a thinking budget gets its
grammar's rows, but the rows its budget forces over the drafts
(``ThinkingBudget.forced_rows``, the rows the workers find from its
state) allow every token, as a forced row without drafts does.

A request's thinking budget forces its next token through the message
(``GrammarBitmask.forced_token_ids``, ``engine.thinking_budget``), not
through its row, which allows every token: the sampler sets the token
after it has read the model's logprobs, so the forced token reports the
model's own logprob, as vLLM's budget (a logits processor that runs after
its raw logprobs are taken) does, and it wins over the request's own token
limits. A budgeted request with drafts in the step sends its budget's
state instead (``GrammarBitmask.thinking_states``; its forced id is -1),
from which the workers find the forced rows among its drafts: each row
carries one of the two, never both. Rows of requests that finished or
were aborted after the plan was made, and of requests still inside their
reasoning, allow every token
(their token is discarded anyway, and a row without any allowed token
would make the sampler's distribution undefined). A matcher
in its error state (a grammar that ran past llguidance's per-step limits)
allows only EOS, so the request ends.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np

from engine.reasoning import ReasoningTokens
from engine.structured_outputs.backend import GuidanceBackend
from engine.structured_outputs.compiler import DEFAULT_TIMEOUT_S, GrammarCompiler
from engine.structured_outputs.grammar import Grammar
from ipc.messages import GrammarBitmask, SchedulerOutput


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class StructuredOutputManager:
    def __init__(self, tokenizer_json_path: str, vocab_size: int, eos_token_ids: list[int],
                 timeout_s: float = DEFAULT_TIMEOUT_S, reasoning: ReasoningTokens | None = None,
                 speculative: bool = False):
        """``speculative``: the runner proposes drafts, so each bitmask asks
        for the next drafts of its requests with a grammar."""
        self.vocab_size = vocab_size
        self.reasoning = reasoning
        self.speculative = speculative
        self.words = bitmask_words(vocab_size)
        self.eos_token_ids = sorted(eos_token_ids)
        self.backend = GuidanceBackend(tokenizer_json_path, vocab_size, self.eos_token_ids)
        self.compiler = GrammarCompiler(self.backend, timeout_s)
        self._executor = None
        self._thread: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._buffer = np.empty((0, self.words), dtype=np.int32)
        self._pending: PendingBitmask | None = None

    # ---- requests --------------------------------------------------------
    def submit(self, params) -> None:
        """Start compiling ``params``'s constraint (SamplingParams); no wait."""
        if params.structured_outputs is not None:
            self.compiler.submit(params.structured_outputs.key)

    def ready(self, params) -> bool:
        """Whether ``check`` would return (or raise) without waiting."""
        so = params.structured_outputs
        return so is None or self.compiler.ready(so.key)

    def check(self, params) -> None:
        """``GrammarError`` when the constraint does not compile (in time)."""
        if params.structured_outputs is not None:
            self.compiler.result(params.structured_outputs.key)

    def new_grammar(self, params, in_reasoning: bool = False) -> Grammar | None:
        """A new matcher for the request (None when unconstrained); for an
        output that begins inside its reasoning (``in_reasoning``, under a
        reasoning parser) it waits for the end of the reasoning."""
        if params.structured_outputs is None:
            return None
        template = self.compiler.result(params.structured_outputs.key)
        end_id = self.reasoning.end_id if in_reasoning and self.reasoning is not None else None
        return Grammar(self.backend.new_matcher(template), end_id)

    # ---- the step --------------------------------------------------------
    def bitmask(self, plan: SchedulerOutput, requests: dict,
                num_drafts: dict[str, int] | None = None) -> GrammarBitmask:
        """The step's bitmask, one row per ``plan.structured_output_req_ids``,
        filled on the calling thread."""
        return self.start_bitmask(plan, requests, background=False,
                                  num_drafts=num_drafts).result()

    def start_bitmask(self, plan: SchedulerOutput, requests: dict,
                      background: bool = True,
                      num_drafts: dict[str, int] | None = None) -> PendingBitmask:
        """Start filling the step's bitmask from the matchers as they are
        now; ``result()`` of the answer waits for it. In the background the
        fill runs in this manager's fill thread (llguidance drops the GIL
        for it), and until ``result()`` returns no matcher of the step may
        be used (llguidance holds them). Rows of requests that are gone,
        whose grammar is complete or that are inside their reasoning allow
        every token, and so does the row of a request whose thinking budget
        forces its next token (``engine.thinking_budget``: the reasoning is
        open, so no grammar holds it), named in ``forced_token_ids``.
        ``num_drafts``: the drafts the step verifies per request (absent:
        none); a budgeted request with drafts sends its budget's state in
        place of a forced id, and one with a grammar and d drafts gets
        1 + d rows over the first d of its ``next_drafts`` (the engine's
        order guarantees they are known: a ``RuntimeError`` otherwise)."""
        if self._pending is not None:
            self._pending.wait()
        req_ids = list(plan.structured_output_req_ids)
        num_drafts = num_drafts or {}
        num_rows = [self._num_rows(requests.get(r), num_drafts.get(r, 0)) for r in req_ids]
        mask = self._rows(sum(num_rows))
        jobs, draft_jobs, grammars, forced_ids = [], [], [], [-1] * len(req_ids)
        states: list[list[int]] = []
        draft_req_ids, free_rows = [], []
        row = 0
        for i, req_id in enumerate(req_ids):
            request = requests.get(req_id)
            grammar = getattr(request, "grammar", None)
            budget = getattr(request, "thinking_budget", None)
            forced = None if budget is None else budget.forced_token()
            if budget is not None and num_drafts.get(req_id, 0):
                if not states:
                    states = [[] for _ in req_ids]
                states[i] = budget.state()
            elif forced is not None:
                forced_ids[i] = forced
            n = num_rows[i]
            if grammar is not None and self.speculative:
                draft_req_ids.append(req_id)
            if n > 1:
                mask[row:row + n] = -1
                drafts = request.next_drafts[:n - 1]
                if len(drafts) != n - 1:
                    raise RuntimeError(f"request {req_id}: {n - 1} drafts in step "
                                       f"{plan.step_id}, {len(drafts)} known")
                walk = _draft_walk(grammar, row, drafts)
                if walk is not None:
                    matcher, first, rest = walk
                    if rest:
                        draft_jobs.append(walk)
                    else:
                        jobs.append((matcher, first))
                grammars.append((row, n, grammar))
                if budget is not None:  # the rows it forces allow every token
                    free_rows += [row + j for j in budget.forced_rows(drafts)]
            elif forced is not None:
                mask[row] = -1
            elif grammar is not None and grammar.constrains():
                jobs.append((grammar.matcher, row))
                grammars.append((row, 1, grammar))
            else:
                mask[row] = -1
            row += n
        future = None
        if (jobs or draft_jobs) and background:
            future = self._fill_thread().submit(self._fill, jobs, mask, draft_jobs)
        elif jobs or draft_jobs:
            self._fill(jobs, mask, draft_jobs)
        forced_ids = forced_ids if any(t >= 0 for t in forced_ids) else []
        self._pending = PendingBitmask(self, plan.step_id, req_ids, mask, grammars, future,
                                       forced_ids, states,
                                       num_rows if len(num_rows) < row else [],
                                       draft_req_ids, free_rows)
        return self._pending

    @staticmethod
    def _num_rows(request, num_drafts: int) -> int:
        """A request's bitmask rows: 1 + its drafts with a grammar (one row
        per position it verifies), else 1."""
        return 1 + num_drafts if getattr(request, "grammar", None) is not None else 1

    def _fill(self, jobs: list, mask: np.ndarray, draft_jobs: list) -> None:
        """Rows of ``jobs`` (matcher, row) and of ``draft_jobs`` (matcher,
        first row, drafts: the rows after consuming each, until one is
        refused or the grammar ends; the matcher rolled back after)."""
        import llguidance.numpy as llg_numpy

        if jobs:
            llg_numpy.fill_next_token_bitmask_par(self._parallel(), jobs, mask)
        if draft_jobs:
            llg_numpy.fill_next_token_bitmask_par_with_draft_tokens(self._parallel(), draft_jobs,
                                                                    mask)

    def _rows(self, n: int) -> np.ndarray:
        """The first ``n`` rows of the persistent mask buffer (grown as
        needed; one fill at a time uses it, and ``result()`` copies it out)."""
        if self._buffer.shape[0] < n:
            self._buffer = np.empty((max(n, 2 * self._buffer.shape[0]), self.words),
                                    dtype=np.int32)
        return self._buffer[:n]

    def _finish(self, pending: PendingBitmask) -> GrammarBitmask:
        for row, n, grammar in pending.grammars:
            if grammar.is_error():
                for r in range(row, row + n):
                    self._eos_only(pending.mask[r])
        pending.mask[pending.free_rows] = -1
        if self._pending is pending:
            self._pending = None
        return GrammarBitmask(step_id=pending.step_id, req_ids=pending.req_ids,
                              bitmask=pending.mask.astype("<i4", copy=False).tobytes(),
                              forced_token_ids=pending.forced_token_ids,
                              thinking_states=pending.thinking_states,
                              num_rows=pending.num_rows, draft_req_ids=pending.draft_req_ids)

    def _eos_only(self, row: np.ndarray) -> None:
        _only(row, *self.eos_token_ids)

    def _parallel(self):
        with self._lock:
            if self._executor is None:
                from llguidance import LLExecutor

                self._executor = LLExecutor()
            return self._executor

    def _fill_thread(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="grammar-fill")
            return self._thread

    def shutdown(self) -> None:
        """Stop compiling; a fill still running finishes first (it holds
        matchers and the mask buffer)."""
        self.compiler.shutdown()
        if self._thread is not None:
            self._thread.shutdown(wait=True)


class PendingBitmask:
    """A step's bitmask being filled (``StructuredOutputManager.start_bitmask``)."""

    def __init__(self, manager: StructuredOutputManager, step_id: int, req_ids: list[str],
                 mask: np.ndarray, grammars: list, future: Future | None,
                 forced_token_ids: list[int], thinking_states: list[list[int]],
                 num_rows: list[int], draft_req_ids: list[str], free_rows: list[int]):
        self.manager, self.step_id, self.req_ids = manager, step_id, req_ids
        self.mask, self.grammars, self.future = mask, grammars, future
        self.forced_token_ids = forced_token_ids
        self.thinking_states = thinking_states
        self.num_rows, self.draft_req_ids = num_rows, draft_req_ids
        self.free_rows = free_rows  # drafted rows a thinking budget forces
        self.message: GrammarBitmask | None = None

    def wait(self) -> None:
        """Until the fill has ended (its error, if any, is ``result``'s)."""
        if self.future is not None:
            wait([self.future])

    def result(self) -> GrammarBitmask:
        """The filled bitmask (the fill's error raised here); once filled,
        the matchers are free again. Idempotent."""
        if self.message is None:
            if self.future is not None:
                self.future.result()
            self.message = self.manager._finish(self)
        return self.message


def _draft_walk(grammar: Grammar, row: int, drafts: list[int]) -> tuple | None:
    """The fill job (matcher, first row, drafts to walk) of a request's
    rows ``row .. row + len(drafts)``, all set to allow every token
    beforehand, or None: none to fill. Row i is the mask after drafts
    1..i. A grammar that holds the next token walks them all (llguidance
    stops at a refused draft, or one after the grammar's end, leaving the
    rows after it as they are); one still inside its reasoning leaves every
    row free up to the one after a drafted end tag, and from there on holds
    from its start; a complete one leaves every row free."""
    if grammar.active:
        return (grammar.matcher, row, drafts) if grammar.constrains() else None
    end = grammar.reasoning_end_id
    if end not in drafts:
        return None
    j = drafts.index(end) + 1
    return grammar.matcher, row + j, drafts[j:]


def _only(row: np.ndarray, *tokens: int) -> None:
    """Make a bitmask row allow ``tokens`` alone."""
    words = row.view(np.uint32)
    words[:] = 0
    for t in tokens:
        words[t // 32] |= np.uint32(1 << (t % 32))
