"""The grammar bitmask on the worker: checked, copied to the device, applied.

A step whose plan lists ``structured_output_req_ids`` samples only once its
``GrammarBitmask`` has arrived (``ModelRunner.sample_tokens``). Here:

- ``check_grammar_bitmask``: the message must answer the pending step (same
  step id, exactly the plan's constrained requests, each once, and
  ``len(req_ids) * ceil(vocab / 32)`` int32 words); otherwise
  ``InvalidPlanError``, the same verdict on every rank (the step is rejected).
- ``GrammarMask.apply``: maps each row to its request's logits row
  (``last_logits_row`` of its batch row: the row it samples from; a
  request with ``GrammarBitmask.num_rows`` n has its last n logits rows
  masked, one row each: with a grammar and drafts, every row the
  rejection sampler verifies them at, so a draft the grammar refuses is
  rejected and every emitted token is one the grammar allows), copies
  mask and rows into persistent device buffers (on CUDA a side stream that
  the main stream waits for, so the copy overlaps the forward pass), and
  masks the logits in place with one kernel, before penalties, temperature
  and filters; the rows of ``forced_token_ids`` come back as
  ``ForcedTokens`` (their logits rows and tokens, copied with the mask) for
  the sampler, which forces each token after it has read the raw logits
  for logprobs and past the request's own masks (a forced row's mask
  allows every token, so its logits stay the model's). A budgeted request
  with drafts in the step comes with its thinking state instead of a
  forced id (``GrammarBitmask``'s contract): its state and its logits rows
  come back as ``DraftedBudgets``, and the rejection sampler finds its
  forced rows from its drafts. A message that breaks the contract (a row
  with both, or a forced id for a request with drafts, which would force
  its last row) is an ``InvalidPlanError``.
- ``apply_grammar_bitmask_ref``: the kernel's torch reference (the Triton
  version is ``runner.triton_grammar_mask``; ``runner.ops`` picks one).

Kernel contract: for every mask row r with ``0 <= logits_rows[r] <
logits.shape[0]`` (others are skipped), every token v whose bit is clear
(bit ``v % 32`` of word ``v // 32``) gets ``-inf`` at ``logits[logits_rows[r],
v]``; nothing else changes.
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.errors import InvalidPlanError
from ipc.messages import GrammarBitmask
from runner.sampling.forced_tokens import ForcedTokens
from runner.spec_decode.drafted_budgets import NUM_COLUMNS, DraftedBudgets


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def check_apply_grammar_bitmask(logits: torch.Tensor, bitmask: torch.Tensor,
                                logits_rows: torch.Tensor) -> None:
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError("apply_grammar_bitmask needs 2-D logits and a 2-D int32 bitmask")
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("apply_grammar_bitmask needs rows of contiguous tokens")
    if bitmask.shape[1] * 32 < logits.shape[1]:
        raise ValueError(f"a bitmask of {bitmask.shape[1]} words cannot cover "
                         f"{logits.shape[1]} tokens")
    if logits_rows.shape != (bitmask.shape[0],):
        raise ValueError("apply_grammar_bitmask needs one logits row per bitmask row")


def apply_grammar_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor,
                              logits_rows: torch.Tensor) -> None:
    """See the module docstring; in place."""
    num_rows, vocab = logits.shape
    if bitmask.shape[0] == 0:
        return
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]
    valid = (logits_rows >= 0) & (logits_rows < num_rows)
    rows = logits_rows[valid].long()
    logits[rows] = logits[rows].masked_fill(~allowed[valid], float("-inf"))


def check_grammar_bitmask(grammar: GrammarBitmask | None, step_id: int,
                          expected_req_ids: list[str], vocab_size: int) -> None:
    """``InvalidPlanError`` unless ``grammar`` is the mask the pending step needs."""
    def fail(message: str) -> None:
        raise InvalidPlanError(f"step {step_id}: {message}")

    if grammar is None:
        if expected_req_ids:
            fail("the plan has constrained requests but no grammar bitmask came")
        return
    if grammar.step_id != step_id:
        fail(f"a grammar bitmask of step {grammar.step_id} came instead of this step's")
    if not expected_req_ids:
        fail("a grammar bitmask came for a step without constrained requests")
    if len(set(grammar.req_ids)) != len(grammar.req_ids):
        fail("the grammar bitmask names a request twice")
    if set(grammar.req_ids) != set(expected_req_ids):
        unknown = sorted(set(grammar.req_ids) - set(expected_req_ids))
        missing = sorted(set(expected_req_ids) - set(grammar.req_ids))
        fail(f"the grammar bitmask's requests do not match the plan's (unknown: "
             f"{unknown[:5]}, missing: {missing[:5]})")
    num_rows = grammar.num_rows
    if num_rows and (len(num_rows) != len(grammar.req_ids) or min(num_rows) < 1):
        fail(f"the grammar bitmask's row counts ({num_rows[:5]}) are not one count >= 1 "
             f"per request ({len(grammar.req_ids)})")
    rows = sum(num_rows) if num_rows else len(grammar.req_ids)
    expected_bytes = rows * bitmask_words(vocab_size) * 4
    if len(grammar.bitmask) != expected_bytes:
        fail(f"the grammar bitmask has {len(grammar.bitmask)} bytes, not {expected_bytes} "
             f"({rows} rows of {bitmask_words(vocab_size)} int32 words)")
    if not set(grammar.draft_req_ids) <= set(grammar.req_ids):
        fail("the grammar bitmask asks for the drafts of requests it does not mask")
    forced = grammar.forced_token_ids
    if forced and len(forced) != len(grammar.req_ids):
        fail(f"the grammar bitmask forces {len(forced)} rows' tokens, not one per row "
             f"({len(grammar.req_ids)})")
    if any(not -1 <= t < vocab_size for t in forced):
        fail(f"the grammar bitmask forces a token outside the vocabulary ({vocab_size})")
    states = grammar.thinking_states
    if states and len(states) != len(grammar.req_ids):
        fail(f"the grammar bitmask has {len(states)} thinking states, not one per row "
             f"({len(grammar.req_ids)})")
    if states and forced and any(state and t >= 0 for state, t in zip(states, forced)):
        fail("the grammar bitmask gives a row both a thinking state and a forced token")
    for state in states:
        if state and not (len(state) == 5 and state[0] in (0, 1) and state[1] >= 0
                          and state[2] >= 0 and all(0 <= t < vocab_size for t in state[3:])):
            fail(f"the grammar bitmask has a thinking state that is not [open 0/1, spent, "
                 f"budget, start id, end id] within the vocabulary: {state[:5]}")


class GrammarMask:
    """Persistent device buffers for one step's mask, and the masking call.

    At most ``max_rows`` constrained requests a step (the runner's
    ``max_num_seqs``) and ``max_rows * width`` mask rows and drafted-budget
    lines (``width``: 1 + the drafts a request may have). The buffers are
    rewritten only after the previous step's kernel has read them
    (``HostTransfer.copy_into_side``).
    """

    def __init__(self, max_rows: int, vocab_size: int, device: torch.device, ops,
                 width: int = 1):
        self.vocab_size = vocab_size
        self.words = bitmask_words(vocab_size)
        self.bitmask = torch.zeros((max_rows * width, self.words), dtype=torch.int32,
                                   device=device)
        self.rows = torch.zeros(max_rows * width, dtype=torch.int32, device=device)
        self.forced_rows = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.forced_ids = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.budget_table = (torch.zeros((max_rows * width, NUM_COLUMNS), dtype=torch.int64,
                                         device=device) if width > 1 else None)
        self.kernel = ops.apply_grammar_bitmask
        self.transfer = ops.new_transfer()

    def apply(self, logits: torch.Tensor, grammar: GrammarBitmask, batch_req_ids: list[str],
              last_logits_row: np.ndarray, num_logits: np.ndarray | None = None,
              ) -> tuple[ForcedTokens | None, DraftedBudgets | None]:
        """Mask ``logits`` in place; ``grammar`` has passed
        ``check_grammar_bitmask``; ``num_logits`` [num_reqs]: each batch
        row's logits rows (None: one each). The rows forced outright and
        the drafted requests' budgets (None: none), for the sampler:
        tensors of their own, not the upload buffers."""
        batch_row = {req_id: i for i, req_id in enumerate(batch_req_ids)}
        order = [batch_row[r] for r in grammar.req_ids]
        rows = np.array([last_logits_row[i] for i in order], dtype=np.int32)
        mask_rows = rows
        if grammar.num_rows:
            mask_rows = _mask_rows(rows, np.array(grammar.num_rows, dtype=np.int32),
                                   None if num_logits is None else num_logits[order])
        n = len(mask_rows)
        # Read in place from the message (the transfer stages it, once).
        mask = np.frombuffer(grammar.bitmask, dtype="<i4").astype(np.int32, copy=False)
        pairs = [(mask.reshape(n, self.words), self.bitmask), (mask_rows, self.rows)]
        forced_ids = np.array(grammar.forced_token_ids, dtype=np.int64)
        if num_logits is not None and forced_ids.size:
            # A forced id speaks of the step's first token; the sampler
            # forces a request's last logits row, its first only without
            # drafts (with drafts its thinking state says which rows).
            several = num_logits[order] > 1
            if np.any(several & (forced_ids >= 0)):
                raise InvalidPlanError("the grammar bitmask forces the token of a request with "
                                       "drafts in the step (its thinking state should say "
                                       "which of its rows are forced)")
        table = None
        if grammar.thinking_states and num_logits is not None and self.budget_table is not None:
            drafted = [r for r, state in enumerate(grammar.thinking_states) if state]
            if drafted:
                table = _drafted_budget_table(grammar.thinking_states, drafted, rows,
                                              num_logits[order])
        forced_at = np.flatnonzero(forced_ids >= 0)
        if forced_at.size:
            pairs += [(rows[forced_at].astype(np.int64), self.forced_rows),
                      (forced_ids[forced_at], self.forced_ids)]
        if table is not None:
            pairs.append((table, self.budget_table))
        self.transfer.copy_into_side(pairs)
        self.kernel(logits, self.bitmask[:n], self.rows[:n])
        k = forced_at.size
        # Copies on the main stream, so the buffers are read before the
        # next step's upload may write them (the sampler reads later).
        forced = (ForcedTokens(self.forced_rows[:k].clone(), self.forced_ids[:k].clone())
                  if k else None)
        budgets = (DraftedBudgets(self.budget_table[: table.shape[0]].clone())
                   if table is not None else None)
        self.transfer.side_buffers_read()
        return forced, budgets


def _mask_rows(last_rows: np.ndarray, num_rows: np.ndarray,
               num_logits: np.ndarray | None) -> np.ndarray:
    """The logits row of every mask row: request r's ``num_rows[r]`` rows
    mask its last that many logits rows (``last_rows[r]`` the last), in
    order; ``InvalidPlanError`` where a request has more mask rows than
    logits rows (``num_logits`` None: one each)."""
    have = np.ones_like(num_rows) if num_logits is None else num_logits
    if np.any(num_rows > have):
        raise InvalidPlanError(f"the grammar bitmask has more rows for a request than its "
                               f"logits rows in the step ({num_rows.tolist()[:5]} for "
                               f"{have.tolist()[:5]})")
    ends = np.cumsum(num_rows)
    offset = np.arange(int(ends[-1])) - np.repeat(ends - num_rows, num_rows)
    first = np.repeat(last_rows - num_rows + 1, num_rows)
    return (first + offset).astype(np.int32)


def _drafted_budget_table(states: list[list[int]], drafted: list[int], last_rows: np.ndarray,
                          num_logits: np.ndarray) -> np.ndarray:
    """``DraftedBudgets.table`` for the message's rows ``drafted`` (a
    thinking state and more than one logits row): each one's logits rows,
    the last ``last_rows[r]``, with their offsets and its state."""
    lines = []
    for r in drafted:
        m = int(num_logits[r])
        first = int(last_rows[r]) - m + 1
        lines += [[first + j, j, *states[r]] for j in range(m)]
    return np.array(lines, dtype=np.int64)
