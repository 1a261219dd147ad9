"""The engine's side of structured outputs: compile, attach, fill the bitmask.

``check`` (when a request enters the engine) compiles its constraint, or
finds it compiled, and raises ``ValueError`` with the backend's message when
it does not compile (in time): nothing of a bad request reaches the workers.
``new_grammar`` gives an accepted request its own matcher. ``bitmask(plan,
requests)`` fills the rows of a step's ``structured_output_req_ids`` from
their matchers, all at once in llguidance's threads (the GIL is dropped);
the engine calls it after absorbing the previous step, while the workers run
the step's forward pass.

Rows of requests that finished or were aborted after the plan was made
allow every token (their token is discarded anyway, and a row without any
allowed token would make the sampler's distribution undefined). A matcher
in its error state (a grammar that ran past llguidance's per-step limits)
allows only EOS, so the request ends.
"""

from __future__ import annotations

import threading

import numpy as np

from engine.structured_outputs.backend import GuidanceBackend
from engine.structured_outputs.compiler import DEFAULT_TIMEOUT_S, GrammarCompiler
from engine.structured_outputs.grammar import Grammar
from ipc.messages import GrammarBitmask, SchedulerOutput


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class StructuredOutputManager:
    def __init__(self, tokenizer_json_path: str, vocab_size: int, eos_token_ids: list[int],
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.vocab_size = vocab_size
        self.words = bitmask_words(vocab_size)
        self.eos_token_ids = sorted(eos_token_ids)
        self.backend = GuidanceBackend(tokenizer_json_path, vocab_size, self.eos_token_ids)
        self.compiler = GrammarCompiler(self.backend, timeout_s)
        self._executor = None
        self._lock = threading.Lock()

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
        """``ValueError`` when the constraint does not compile (in time)."""
        if params.structured_outputs is not None:
            self.compiler.result(params.structured_outputs.key)

    def new_grammar(self, params) -> Grammar | None:
        """A new matcher for the request (None when unconstrained)."""
        if params.structured_outputs is None:
            return None
        template = self.compiler.result(params.structured_outputs.key)
        return Grammar(self.backend.new_matcher(template))

    # ---- the step --------------------------------------------------------
    def bitmask(self, plan: SchedulerOutput, requests: dict) -> GrammarBitmask:
        """The step's bitmask, one row per ``plan.structured_output_req_ids``."""
        import llguidance.numpy as llg_numpy

        req_ids = list(plan.structured_output_req_ids)
        mask = np.full((len(req_ids), self.words), -1, dtype=np.int32)
        jobs, grammars = [], []
        for row, req_id in enumerate(req_ids):
            request = requests.get(req_id)
            grammar = getattr(request, "grammar", None)
            if grammar is not None and not grammar.is_terminated():
                jobs.append((grammar.matcher, row))
                grammars.append((row, grammar))
        if jobs:
            llg_numpy.fill_next_token_bitmask_par(self._parallel(), jobs, mask)
        for row, grammar in grammars:
            if grammar.is_error():
                self._eos_only(mask[row])
        return GrammarBitmask(step_id=plan.step_id, req_ids=req_ids,
                              bitmask=mask.astype("<i4", copy=False).tobytes())

    def _eos_only(self, row: np.ndarray) -> None:
        words = row.view(np.uint32)
        words[:] = 0
        for t in self.eos_token_ids:
            words[t // 32] |= np.uint32(1 << (t % 32))

    def _parallel(self):
        with self._lock:
            if self._executor is None:
                from llguidance import LLExecutor

                self._executor = LLExecutor()
            return self._executor

    def shutdown(self) -> None:
        self.compiler.shutdown()
