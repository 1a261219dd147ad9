"""Which logits rows of a drafted request its thinking budget forces.

A request with a thinking budget and d drafts in a step has 1 + d logits
rows; row j samples the token after the drafts 0 .. j-1, so whether its
token is forced (the end tag, once an open thinking section holds the
budget's tokens: ``engine.thinking_budget``) depends on those drafts, which
only the device holds. The host sends the budget's exact state after every
token before the step's first (``GrammarBitmask.thinking_states``: open,
spent, budget, start id, end id); here the state is folded over the drafts
before each row, on the device, without a host sync, by the same rule as
``ThinkingBudget.accept``: a start tag opens a section at 0, an end tag
closes it, any other token adds one to an open section. The nearest tag
before a row decides: a start tag c drafts back leaves the section open
with c spent, an end tag leaves it closed; with none, the state sent goes
on with the row's j drafts added where it was open.

A row's drafts are used only where every draft before it is accepted, so
the drafts folded are the tokens the output then holds, and the forced
rows are those a step without drafts would force (vLLM's
``force_index`` within the draft positions is the same rule). The
rejection sampler then takes the end tag at a forced row: its draft passes
only if it is the end tag, and the token emitted there is the end tag.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runner.sampling.forced_tokens import ForcedTokens

# Columns of the per-row table (``DraftedBudgets.table``).
ROW, OFFSET, OPEN, SPENT, BUDGET, START, END = range(7)
NUM_COLUMNS = 7


@dataclass(frozen=True)
class DraftedBudgets:
    """``table`` int64 [R, NUM_COLUMNS] on the device: one line per logits
    row of a drafted request with a budget (rows distinct): the logits row,
    its offset j in its request's rows, and the request's budget state
    before the step's first row (open 0/1, spent, budget, start id, end id)."""

    table: torch.Tensor

    def forced_tokens(self, prior_drafts: torch.Tensor) -> ForcedTokens:
        """``prior_drafts`` [L, W - 1]: the drafts of each logits row's
        request before it, nearest first, -1 where none
        (``DraftLayout.prior_drafts``). The rows, each with the end tag,
        forced where the folded state says."""
        t = self.table
        rows = t[:, ROW]
        before = prior_drafts[rows]
        is_start = before == t[:, START, None]
        is_tag = is_start | (before == t[:, END, None])
        any_tag = is_tag.any(dim=1)
        nearest = is_tag.to(torch.int32).argmax(dim=1)  # the first tag, nearest first
        opened_by_draft = is_start.gather(1, nearest[:, None])[:, 0]
        open_ = torch.where(any_tag, opened_by_draft, t[:, OPEN] != 0)
        spent = torch.where(any_tag, nearest, t[:, SPENT] + t[:, OFFSET])
        return ForcedTokens(rows, t[:, END].clone(), open_ & (spent >= t[:, BUDGET]))
