"""vLLM's ``thinking_token_budget``: at most that many tokens in a thinking
section, then its end, forced.

The budget counts as vLLM's does, per thinking section: one is open where
the prompt's last start tag follows its last end tag (its tokens after
that tag count already: a template that writes ``<think>\n`` leaves the
output one fewer), or from a start tag the output writes; an end tag
closes it, and a later start tag opens a new one, counted from 0. Tags are
not counted. Once an open section holds the budget's tokens, the next
token is the end tag, forced; the output then goes on. A budget of 0
forces the end tag right after the start tag (first, where the prompt
opened the section). An output that never opens a section is left alone,
whatever the parser reads it as. The parsers' end tag is one token
(``reasoning_tokens`` refuses a tokenizer without it), so the forcing
takes one step; vLLM forces an end of several ids one a step.

The engine knows every token it appends (``accept``, called by the
scheduler with each one, so the state follows ``output_token_ids`` across
preemptions too) and forces through the step's bitmask message
(``StructuredOutputManager.start_bitmask``): it names the end tag
(``forced_token``) as the request's forced token, and the sampler sets it
after reading the model's logits for logprobs, so the end tag reports the
model's own logprob. The bitmask of a step is filled once the
step before it is absorbed, so it knows every earlier token even with
async scheduling; the scheduler lists the request for a bitmask only in
the steps that may force (``may_force``), so every other step of it
samples as without a budget.

With speculative decoding a budgeted request takes drafts like any other.
Its step then has 1 + d rows, and whether row j is forced depends on the
drafts before it, which the host does not know (they are proposed on the
device): a drafted start tag opens a section at 0, an end tag closes it,
other tokens spend. So the message carries the budget's exact state
(``state``, with the same reasoning as for ``forced_token``: every token
before the step is known when its bitmask is filled) and the device folds
it over the drafts (``runner.spec_decode.drafted_budgets``, vLLM's
``force_index`` among the draft positions); the rejection sampler takes
the end tag at a forced row (its draft passes only if it is the end tag,
and the row emits the end tag), so a greedy output is token for token the
one without drafts, and a sampled one is drawn from the same forced
target. ``may_force`` stays conservative: the scheduler counts each step
in flight at 1 + its drafts, all accepted, and the step's own drafts
before its last row. A request with a grammar too is the exception where
the host knows the drafts (they come back for its grammar rows): the
same fold over them (``forced_rows``) frees its grammar rows that the
budget forces, as a forced row without drafts is free.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.reasoning import ReasoningTokens
from ipc.errors import InvalidRequestError


def check_budget_has_parser(thinking_token_budget: int | None,
                            reasoning_parser: str | None) -> None:
    """A budget needs a reasoning parser (``reasoning_parser``: the engine's
    resolved one, None for none), which tells where thinking starts and
    ends; ``InvalidRequestError`` naming ``thinking_token_budget`` without
    one. The one home of the rule: the engine checks each request by it,
    and ``tprun generate`` its options before any worker starts."""
    if thinking_token_budget is not None and reasoning_parser is None:
        raise InvalidRequestError(
            "thinking_token_budget needs a reasoning parser, which tells where the "
            "thinking starts and ends: start the engine with --reasoning-parser "
            "(LLM(reasoning_parser=...))", param="thinking_token_budget")


class ThinkingBudget:
    """One request's budget. Invariant: ``open`` says whether a thinking
    section is open after the prompt and the tokens ``accept``ed so far,
    and ``spent`` counts that section's tokens (0 when none is open)."""

    def __init__(self, budget: int, tokens: ReasoningTokens,
                 prompt_token_ids: Sequence[int]) -> None:
        self.budget = budget
        self.tokens = tokens
        opened_at = _open_section(tokens, prompt_token_ids)
        self.open = opened_at is not None
        self.spent = 0 if opened_at is None else len(prompt_token_ids) - 1 - opened_at

    def accept(self, token: int) -> None:
        """One output token, in order."""
        if token == self.tokens.start_id:
            self.open, self.spent = True, 0
        elif token == self.tokens.end_id:
            self.open, self.spent = False, 0
        elif self.open:
            self.spent += 1

    def forced_token(self) -> int | None:
        """The token the next one must be (the end tag, once the budget is
        spent inside an open section), or None: free."""
        return self.tokens.end_id if self.open and self.spent >= self.budget else None

    def state(self) -> list[int]:
        """What the device needs to find the forced rows among a step's
        drafts (``GrammarBitmask.thinking_states``): ``[open, spent,
        budget, start id, end id]``."""
        return [int(self.open), self.spent, self.budget, self.tokens.start_id,
                self.tokens.end_id]

    def forced_rows(self, drafts: Sequence[int]) -> list[int]:
        """The rows j (0 .. len(drafts)) of a drafted step whose token the
        budget forces, row j coming after drafts 1..j: the rows the device
        finds (``runner.spec_decode.drafted_budgets``), here where the
        drafts are known (a request with a grammar too, whose rows the host
        fills). Leaves the budget as it is."""
        walk = ThinkingBudget.__new__(ThinkingBudget)
        walk.budget, walk.tokens, walk.open, walk.spent = (self.budget, self.tokens, self.open,
                                                           self.spent)
        rows = []
        for j, token in enumerate([*drafts, None]):
            if walk.forced_token() is not None:
                rows.append(j)
            if token is not None:
                walk.accept(token)
        return rows

    def may_force(self, num_pending: int) -> bool:
        """Whether the next token may be forced, with ``num_pending`` tokens
        sampled or drafted before it but not accepted yet: each may add one
        to an open section, and one may open a section the rest add to.
        Monotone in ``num_pending``: the scheduler asks with every token in
        flight before a step's last row (each step in flight counted at 1 +
        its drafts, all accepted), so a step none of whose rows may be
        forced is never listed."""
        most = self.spent + num_pending if self.open else num_pending - 1
        return most >= self.budget


def _open_section(tokens: ReasoningTokens, prompt_token_ids: Sequence[int]) -> int | None:
    """The index of the prompt's last start tag where no end tag follows
    it (the prompt ends inside a thinking section), else None."""
    for i in range(len(prompt_token_ids) - 1, -1, -1):
        if prompt_token_ids[i] == tokens.start_id:
            return i
        if prompt_token_ids[i] == tokens.end_id:
            return None
    return None
