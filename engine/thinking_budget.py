"""vLLM's ``thinking_token_budget``: at most that many reasoning tokens, then
the end of the thinking, forced.

Under a reasoning parser (``engine.reasoning``) a request whose output
begins inside its reasoning (``Request.starts_in_reasoning``, the engine's
decision) spends its budget on its reasoning tokens: those of its prompt
after the prompt's last start tag (a prompt that ends inside a thinking
already under way, as vLLM counts it), then each output token before the
first end tag, tags not counted (the reasoning as the parser reads it:
``completion_tokens_details.reasoning_tokens``). Once the budget is spent
and the reasoning still open, the next token is the end tag, forced; the
output then goes on as the answer. A budget of 0 forces the end tag as the
first token. A request whose output begins after its reasoning has none to
spend: nothing is forced. The parsers' end tag is one token
(``reasoning_tokens`` refuses a tokenizer without it), so the forcing takes
one step; vLLM forces an end of several ids one a step.

The engine knows every token it appends (``accept``, called by the
scheduler with each one, so the state follows ``output_token_ids`` across
preemptions too) and forces through the step's token bitmask
(``StructuredOutputManager.start_bitmask``): the request's row allows only
the end tag (``forced_token``). The bitmask of a step is filled once the
step before it is absorbed, so it knows every earlier token even with
async scheduling; the scheduler lists the request for a bitmask only in
the steps that may force (``may_force``), and gives it no drafts while its
reasoning is open, so every other step of it samples as without a budget.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.reasoning import ReasoningTokens


class ThinkingBudget:
    """One request's budget. Invariant: ``spent`` counts the reasoning
    tokens of the prompt and of the tokens ``accept``ed while ``open``
    (the reasoning has not ended)."""

    def __init__(self, budget: int, tokens: ReasoningTokens,
                 prompt_token_ids: Sequence[int]) -> None:
        self.budget = budget
        self.tokens = tokens
        self.spent = _reasoning_in_prompt(tokens, prompt_token_ids)
        self.open = True

    def accept(self, token: int) -> None:
        """One output token, in order."""
        if not self.open:
            return
        if token == self.tokens.end_id:
            self.open = False
        elif token != self.tokens.start_id:
            self.spent += 1

    def forced_token(self) -> int | None:
        """The token the next one must be (the end tag, once the budget is
        spent inside an open reasoning), or None: free."""
        return self.tokens.end_id if self.open and self.spent >= self.budget else None

    def may_force(self, num_pending: int) -> bool:
        """Whether the next token may be forced, with ``num_pending`` tokens
        sampled before it but not accepted yet (each at most one more
        reasoning token)."""
        return self.open and self.spent + num_pending >= self.budget


def _reasoning_in_prompt(tokens: ReasoningTokens, prompt_token_ids: Sequence[int]) -> int:
    """The prompt's tokens after its last start tag, where no end tag
    follows it; 0 for a prompt without one."""
    for i in range(len(prompt_token_ids) - 1, -1, -1):
        if prompt_token_ids[i] == tokens.start_id:
            return len(prompt_token_ids) - 1 - i
        if prompt_token_ids[i] == tokens.end_id:
            return 0
    return 0
