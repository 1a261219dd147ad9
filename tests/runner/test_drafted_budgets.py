"""The forced rows of drafted requests with a thinking budget, found on the
device (``runner.spec_decode.drafted_budgets``), against the host's count
(``engine.thinking_budget.ThinkingBudget``) replayed over the same drafts;
the message's state through ``GrammarMask`` into the rejection sampler's
rows; ``ForcedTokens`` with a mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.reasoning import ReasoningTokens
from engine.thinking_budget import ThinkingBudget
from ipc.errors import InvalidPlanError
from ipc.messages import GrammarBitmask
from runner.ops import device_ops
from runner.sampling.forced_tokens import ForcedTokens
from runner.spec_decode.drafted_budgets import DraftedBudgets
from runner.spec_decode.rejection import DraftLayout
from runner.structured_outputs import GrammarMask, check_grammar_bitmask
from tests.helpers.grammar_masks import mask_message

S, E, VOCAB = 7, 8, 70
NEG_INF = float("-inf")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))]


def _host_forced(prompt: list[int], budget: int, drafts: list[int]) -> list[bool]:
    """Row j (after drafts 0..j-1) forced, by the host's count."""
    state = ThinkingBudget(budget, ReasoningTokens(S, E), prompt)
    forced = []
    for token in [*drafts, None]:
        forced.append(state.forced_token() == E)
        if token is not None:
            state.accept(token)
    return forced


@pytest.mark.parametrize("device", DEVICES)
def test_the_device_fold_forces_the_rows_the_host_count_forces(device):
    """Random budgets, prompts (open, closed or no section, some reasoning
    spent) and drafts full of tags, several requests in one batch, with
    rows of other requests between them."""
    rng = np.random.default_rng(0)
    k = 4
    for _ in range(60):
        num_reqs = int(rng.integers(1, 5))
        counts = rng.integers(1, k + 2, num_reqs)  # logits rows of each batch row
        cu = np.concatenate([[0], np.cumsum(counts)])
        drafts = rng.choice([S, E, 1, 2, 3], size=int(cu[-1]), p=[.2, .2, .2, .2, .2])
        budgeted = [i for i in range(num_reqs) if counts[i] > 1 and rng.random() < 0.7]
        lines, want = [], []
        for i in budgeted:
            prompt = [1, *rng.choice([S, E, 1, 2], size=int(rng.integers(0, 5))).tolist()]
            budget = int(rng.integers(0, 4))
            host = ThinkingBudget(budget, ReasoningTokens(S, E), prompt)
            state = host.state()
            row_drafts = drafts[cu[i]: cu[i + 1] - 1].tolist()
            want += _host_forced(prompt, budget, row_drafts)
            # The host's own walk over known drafts (a request with a grammar).
            assert host.forced_rows(row_drafts) == [
                j for j, f in enumerate(_host_forced(prompt, budget, row_drafts)) if f]
            assert host.state() == state  # left as it was
            lines += [[int(cu[i]) + j, j, *state] for j in range(int(counts[i]))]
        if not lines:
            continue
        cu_t = torch.tensor(cu, device=device)
        layout = DraftLayout.build(cu_t, num_reqs, int(cu[-1]), 1 + k)
        prior = layout.prior_drafts(torch.tensor(drafts, device=device), 1 + k)
        got = DraftedBudgets(torch.tensor(lines, device=device)).forced_tokens(prior)
        assert got.forced.tolist() == want
        assert got.rows.tolist() == [line[0] for line in lines]
        assert set(got.token_ids.tolist()) == {E}


def test_hand_worked_rows():
    """Budget 2, a section open with 1 spent, drafts [3, S, 4]: row 0 free
    (1 spent), row 1 forced (2 spent after 3), row 2 free (the start tag
    reopened it at 0), row 3 free (1). Budget 0, open with 2 spent, drafts
    [E, S, 4]: row 0 forced, row 1 free (closed), row 2 forced (reopened,
    0 >= 0), row 3 forced."""
    table = [[r, r, 1, 1, 2, S, E] for r in range(4)]
    table += [[4 + r, r, 1, 2, 0, S, E] for r in range(4)]
    drafts = torch.tensor([3, S, 4, 0, E, S, 4, 0])
    cu = torch.tensor([0, 4, 8])
    layout = DraftLayout.build(cu, 2, 8, 4)
    got = DraftedBudgets(torch.tensor(table)).forced_tokens(layout.prior_drafts(drafts, 4))
    assert got.forced.tolist() == [False, True, False, False, True, False, True, True]


@pytest.mark.parametrize("device", DEVICES)
def test_forced_tokens_with_a_mask_force_only_the_masked_rows(device):
    logits = torch.randn(4, VOCAB, device=device)
    before = logits.clone()
    fixed = ForcedTokens(torch.tensor([3], device=device), torch.tensor([5], device=device))
    masked = ForcedTokens(torch.tensor([0, 2], device=device), torch.tensor([9, 9], device=device),
                          torch.tensor([True, False], device=device))
    fixed.merged(masked).apply(logits)
    want = before.clone()
    for row, token in ((0, 9), (3, 5)):
        want[row] = NEG_INF
        want[row, token] = 0.0
    assert torch.equal(logits, want)


def _message(states: dict[str, list[int]], forced: dict[str, int]) -> GrammarBitmask:
    message = mask_message(3, {r: list(range(VOCAB)) for r in states}, VOCAB)
    return GrammarBitmask(step_id=3, req_ids=message.req_ids, bitmask=message.bitmask,
                          forced_token_ids=[forced.get(r, -1) for r in message.req_ids],
                          thinking_states=[states[r] for r in message.req_ids])


def test_grammar_mask_hands_a_drafted_requests_rows_and_state_to_the_sampler():
    """Batch a (2 logits rows), b (3 rows, budgeted: its state, forced id
    -1, as the engine sends a drafted row), c (1 row, budgeted, forced: its
    forced id, no state): b's rows 2..4 come back with their offsets and
    b's state; c's one row is forced outright."""
    mask = GrammarMask(max_rows=4, vocab_size=VOCAB, device=torch.device("cpu"),
                       ops=device_ops(torch.device("cpu")), width=4)
    state_b = [1, 2, 2, S, E]
    message = _message({"b": state_b, "c": []}, {"c": E})
    check_grammar_bitmask(message, 3, ["b", "c"], VOCAB)
    logits = torch.randn(6, VOCAB)
    forced, budgets = mask.apply(logits, message, ["a", "b", "c"], np.array([1, 4, 5]),
                                 np.array([2, 3, 1]))
    assert forced.rows.tolist() == [5] and forced.token_ids.tolist() == [E]
    assert budgets.table.tolist() == [[2 + j, j, *state_b] for j in range(3)]
    # Without drafts (no counts, no states), the message's forced ids alone.
    forced, budgets = mask.apply(logits, _message({"b": [], "c": []}, {"b": E, "c": E}),
                                 ["b", "c"], np.array([0, 1]))
    assert sorted(forced.rows.tolist()) == [0, 1] and budgets is None


def test_a_row_with_both_a_state_and_a_forced_id_is_refused():
    """The contract's "never both": refused before anything is masked."""
    message = _message({"b": [1, 2, 2, S, E], "c": []}, {"b": E})
    with pytest.raises(InvalidPlanError, match="both a thinking state and a forced token"):
        check_grammar_bitmask(message, 3, ["b", "c"], VOCAB)


def test_a_forced_id_for_a_request_with_drafts_is_refused():
    """b has 3 logits rows (two drafts): a forced id speaks of its first
    token, but the sampler forces the row it samples from last, the bonus
    row, so such a message is refused and the logits are left alone; with
    one logits row the same id is forced there."""
    mask = GrammarMask(max_rows=4, vocab_size=VOCAB, device=torch.device("cpu"),
                       ops=device_ops(torch.device("cpu")), width=4)
    message = _message({"b": [], "c": []}, {"b": E})
    check_grammar_bitmask(message, 3, ["b", "c"], VOCAB)
    logits = torch.randn(6, VOCAB)
    before = logits.clone()
    with pytest.raises(InvalidPlanError, match="forces the token of a request with drafts"):
        mask.apply(logits, message, ["a", "b", "c"], np.array([1, 4, 5]), np.array([2, 3, 1]))
    assert torch.equal(logits, before)
    forced, _ = mask.apply(logits, message, ["a", "b", "c"], np.array([1, 2, 3]),
                           np.array([2, 1, 1]))
    assert forced.rows.tolist() == [2] and forced.token_ids.tolist() == [E]


@pytest.mark.parametrize("state", [[1, 2, 2, S], [2, 0, 1, S, E], [0, -1, 1, S, E],
                                   [1, 0, -1, S, E], [1, 0, 1, S, VOCAB]])
def test_a_bad_thinking_state_is_refused(state):
    with pytest.raises(InvalidPlanError, match="thinking state"):
        check_grammar_bitmask(_message({"b": state}, {}), 3, ["b"], VOCAB)
    bad_count = GrammarBitmask(step_id=3, req_ids=["b"], bitmask=_message(
        {"b": []}, {}).bitmask, thinking_states=[[], []])
    with pytest.raises(InvalidPlanError, match="thinking states"):
        check_grammar_bitmask(bad_count, 3, ["b"], VOCAB)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_drafted_rows_are_found_without_a_host_sync():
    device = torch.device("cuda")
    mask = GrammarMask(max_rows=4, vocab_size=VOCAB, device=device, ops=device_ops(device),
                       width=4)
    message = _message({"b": [1, 1, 2, S, E]}, {})
    drafts = torch.tensor([1, 3, 4, 0, 2], device=device)
    cu = torch.tensor([0, 1, 5], device=device)
    logits = torch.randn(5, VOCAB, device=device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _, budgets = mask.apply(logits, message, ["a", "b"], np.array([0, 4]),
                                np.array([1, 4]))
        layout = DraftLayout.build(cu, 2, 5, 4)
        forced = budgets.forced_tokens(layout.prior_drafts(drafts, 4))
        forced.apply(logits)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # Rows 1..4 of b: 1 spent, then 2 after the draft 3: forced from row 2 on.
    assert forced.forced.tolist() == [False, True, True, True]
    assert (logits[2:].argmax(dim=1) == E).all() and logits[2, E] == 0
