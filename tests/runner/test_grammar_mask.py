"""The grammar bitmask kernel: a hand-worked case (vocabulary of 70, not a
multiple of 32), the torch reference against a plain Python oracle on random
masks, the Triton kernel (interpreted on CPU, compiled on a GPU) against the
reference, and the checks on a received bitmask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ipc.errors import InvalidPlanError
from ipc.messages import GrammarBitmask
from runner.ops import device_ops, torch_ops, triton_ops
from runner.structured_outputs import (
    GrammarMask,
    apply_grammar_bitmask_ref,
    check_grammar_bitmask,
)
from tests.helpers.grammar_masks import mask_message, words_allowing
from tests.helpers.kernel_device import KERNEL_DEVICE

NEG_INF = float("-inf")


def oracle(logits: list[list[float]], mask: list[list[int]], rows: list[int]):
    out = [list(r) for r in logits]
    for r, row in enumerate(rows):
        if not 0 <= row < len(out):
            continue
        for v in range(len(out[row])):
            if not (mask[r][v // 32] >> (v % 32)) & 1:
                out[row][v] = NEG_INF
    return out


KERNELS = {
    "reference": apply_grammar_bitmask_ref,
    "cpu ops": device_ops(torch.device("cpu")).apply_grammar_bitmask,
    "triton": triton_ops(KERNEL_DEVICE).apply_grammar_bitmask,
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_hand_worked_vocab_70(name):
    # Three logits rows; two mask rows: row 0 of the mask masks logits row 2,
    # row 1 masks logits row 0; logits row 1 is unconstrained.
    vocab = 70  # words: 0..31, 32..63, 64..69 (bits 6..31 of the last word unused)
    mask = [words_allowing(vocab, [0, 31, 32, 69]), words_allowing(vocab, [5, 63, 64])]
    assert mask[0] == [-(1 << 31) + 1, 1, 32]  # bits 0 and 31; bit 0; bit 5 (token 69)
    logits = torch.arange(3 * vocab, dtype=torch.float32).reshape(3, vocab)
    expected = logits.clone()
    keep2 = expected[2, [0, 31, 32, 69]].clone()
    expected[2] = NEG_INF
    expected[2, [0, 31, 32, 69]] = keep2
    keep0 = expected[0, [5, 63, 64]].clone()
    expected[0] = NEG_INF
    expected[0, [5, 63, 64]] = keep0
    device = KERNEL_DEVICE if name == "triton" else torch.device("cpu")
    logits = logits.to(device)
    KERNELS[name](logits, torch.tensor(mask, dtype=torch.int32, device=device),
                  torch.tensor([2, 0], dtype=torch.int32, device=device))
    assert torch.equal(logits.cpu(), expected)
    assert torch.isfinite(logits[1]).all()  # the unconstrained row is untouched


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 70, 1000, 2053])
def test_reference_matches_oracle_and_triton_matches_reference(vocab):
    gen = torch.Generator().manual_seed(vocab)
    num_logits, num_rows = 5, 4
    words = (vocab + 31) // 32
    mask = torch.randint(-(1 << 31), (1 << 31) - 1, (num_rows, words), generator=gen,
                         dtype=torch.int64).to(torch.int32)
    # Row 3 points past the step's logits (skipped); row 1 masks logits row 4.
    rows = torch.tensor([0, 4, 2, num_logits + 3], dtype=torch.int32)
    logits = torch.randn(num_logits, vocab, generator=gen)
    expected = oracle(logits.tolist(), mask.tolist(), rows.tolist())
    ref = logits.clone()
    apply_grammar_bitmask_ref(ref, mask, rows)
    assert ref.tolist() == expected
    tri = logits.clone().to(KERNEL_DEVICE)
    triton_ops(KERNEL_DEVICE).apply_grammar_bitmask(tri, mask.to(KERNEL_DEVICE),
                                                    rows.to(KERNEL_DEVICE))
    assert torch.equal(tri.cpu(), ref)


def test_no_rows_and_bad_shapes():
    ops = torch_ops(torch.device("cpu"))
    logits = torch.zeros(2, 40)
    ops.apply_grammar_bitmask(logits, torch.zeros(0, 2, dtype=torch.int32),
                              torch.zeros(0, dtype=torch.int32))
    assert (logits == 0).all()
    with pytest.raises(ValueError, match="cannot cover 40 tokens"):
        ops.apply_grammar_bitmask(logits, torch.zeros(1, 1, dtype=torch.int32),
                                  torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="one logits row per bitmask row"):
        ops.apply_grammar_bitmask(logits, torch.zeros(1, 2, dtype=torch.int32),
                                  torch.zeros(2, dtype=torch.int32))


def _bitmask(step_id, req_ids, vocab, extra_bytes=0, forced=()):
    words = (vocab + 31) // 32
    data = np.full((len(req_ids), words), -1, dtype="<i4").tobytes() + b"\0" * extra_bytes
    return GrammarBitmask(step_id=step_id, req_ids=req_ids, bitmask=data,
                          forced_token_ids=list(forced))


@pytest.mark.parametrize("grammar, pattern", [
    (None, "no grammar bitmask came"),
    (_bitmask(8, ["a", "b"], 70), "of step 8 came instead"),
    (_bitmask(7, ["a"], 70), r"missing: \['b'\]"),
    (_bitmask(7, ["a", "b", "c"], 70), r"unknown: \['c'\]"),
    (_bitmask(7, ["a", "a"], 70), "names a request twice"),
    (_bitmask(7, ["a", "b"], 70, extra_bytes=4), "has 28 bytes, not 24"),
    (_bitmask(7, ["a", "b"], 33), "has 16 bytes, not 24"),
    (_bitmask(7, ["a", "b"], 70, forced=[3]), "forces 1 rows' tokens, not one per row"),
    (_bitmask(7, ["a", "b"], 70, forced=[-1, 70]), "outside the vocabulary"),
    (_bitmask(7, ["a", "b"], 70, forced=[-2, 3]), "outside the vocabulary"),
])
def test_received_bitmask_is_checked(grammar, pattern):
    with pytest.raises(InvalidPlanError, match=pattern):
        check_grammar_bitmask(grammar, 7, ["b", "a"], 70)


def test_received_bitmask_accepted_in_any_order():
    check_grammar_bitmask(_bitmask(7, ["a", "b"], 70), 7, ["b", "a"], 70)
    check_grammar_bitmask(_bitmask(7, ["a", "b"], 70, forced=[-1, 69]), 7, ["b", "a"], 70)
    check_grammar_bitmask(None, 7, [], 70)
    with pytest.raises(InvalidPlanError, match="without constrained requests"):
        check_grammar_bitmask(_bitmask(7, [], 70), 7, [], 70)


def _expected(logits: torch.Tensor, keep: dict[int, list[int]]) -> torch.Tensor:
    out = logits.clone()
    for row, tokens in keep.items():
        kept = out[row, tokens].clone()
        out[row] = NEG_INF
        out[row, tokens] = kept
    return out


def test_grammar_mask_maps_requests_to_their_batch_rows():
    vocab = 70
    mask = GrammarMask(max_rows=4, vocab_size=vocab, device=torch.device("cpu"),
                       ops=device_ops(torch.device("cpu")))
    logits = torch.randn(3, vocab)
    expected = _expected(logits, {1: [3, 69], 0: [40]})
    # Batch order c, a, b: a's row is batch row 1, c's batch row 0; b is free.
    forced, budgets = mask.apply(logits, mask_message(0, {"a": [3, 69], "c": [40]}, vocab),
                                 ["c", "a", "b"], np.arange(3))
    assert torch.equal(logits, expected) and forced is None and budgets is None


def test_grammar_mask_hands_the_forced_rows_to_the_sampler():
    """A forced row's logits row and token come back as ``ForcedTokens``,
    whose ``apply`` keeps that token alone in the row (0 there, -inf
    elsewhere), other rows untouched."""
    vocab = 70
    mask = GrammarMask(max_rows=4, vocab_size=vocab, device=torch.device("cpu"),
                       ops=device_ops(torch.device("cpu")))
    message = mask_message(0, {"a": [3, 69], "c": [40]}, vocab)
    message = GrammarBitmask(step_id=0, req_ids=message.req_ids, bitmask=message.bitmask,
                             forced_token_ids=[40 if r == "c" else -1 for r in message.req_ids])
    logits = torch.randn(3, vocab)
    forced, _ = mask.apply(logits, message, ["c", "a", "b"], np.array([2, 1, 0]))
    assert forced.rows.tolist() == [2] and forced.token_ids.tolist() == [40]
    limited = torch.randn(3, vocab)
    limited[2, 40] = NEG_INF  # the request's own limits left the token out
    want = limited.clone()
    want[2] = NEG_INF
    want[2, 40] = 0.0
    assert torch.equal(forced.apply(limited), want)


def _rows_message(rows: dict[str, list[list[int]]], vocab: int,
                  draft_req_ids=()) -> GrammarBitmask:
    """A bitmask with ``rows[r]``: the allowed tokens of each of r's rows."""
    data = np.array([words_allowing(vocab, tokens) for r in rows for tokens in rows[r]],
                    dtype="<i4").tobytes()
    return GrammarBitmask(step_id=0, req_ids=list(rows), bitmask=data,
                          num_rows=[len(v) for v in rows.values()],
                          draft_req_ids=list(draft_req_ids))


def test_grammar_mask_masks_every_row_of_a_request_with_several():
    """Batch a (3 logits rows, 3 mask rows: one each), b (2 logits rows,
    1 mask row: its last), c (1 and 1): each mask row masks its own
    logits row; b's first row is left alone."""
    vocab = 70
    mask = GrammarMask(max_rows=3, vocab_size=vocab, device=torch.device("cpu"),
                       ops=device_ops(torch.device("cpu")), width=3)
    message = _rows_message({"b": [[4]], "a": [[1], [2, 3], [69]], "c": [[5]]}, vocab)
    check_grammar_bitmask(message, 0, ["a", "b", "c"], vocab)
    logits = torch.randn(6, vocab)
    expected = _expected(logits, {0: [1], 1: [2, 3], 2: [69], 4: [4], 5: [5]})
    mask.apply(logits, message, ["a", "b", "c"], np.array([2, 4, 5]), np.array([3, 2, 1]))
    assert torch.equal(logits, expected)
    # More mask rows than logits rows: the step is refused.
    with pytest.raises(InvalidPlanError, match="more rows for a request than its logits rows"):
        mask.apply(logits, _rows_message({"c": [[5], [5]]}, vocab), ["a", "b", "c"],
                   np.array([2, 4, 5]), np.array([3, 2, 1]))


@pytest.mark.parametrize("num_rows, draft_req_ids, pattern", [
    ([2], [], "not one count >= 1 per request"),
    ([2, 0], [], "not one count >= 1 per request"),
    ([1, 2], [], "has 24 bytes, not 36"),
    ([1, 1], ["c"], "drafts of requests it does not mask"),
])
def test_received_row_counts_are_checked(num_rows, draft_req_ids, pattern):
    grammar = GrammarBitmask(step_id=7, req_ids=["a", "b"], bitmask=b"\xff" * 24,
                             num_rows=num_rows, draft_req_ids=draft_req_ids)
    with pytest.raises(InvalidPlanError, match=pattern):
        check_grammar_bitmask(grammar, 7, ["a", "b"], 70)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grammar_mask_on_cuda_reuses_its_buffers_in_order_without_waiting():
    """Steps back to back: each copy (side stream) must wait for the previous
    step's kernel to have read the buffers, and the kernel for its copy;
    the host never waits for the device."""
    vocab, device = 1000, torch.device("cuda")
    rng = np.random.default_rng(0)
    mask = GrammarMask(max_rows=8, vocab_size=vocab, device=device, ops=device_ops(device))
    results, expected = [], []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(30):
            n = int(rng.integers(1, 9))
            allowed = {f"r{i}": sorted(rng.choice(vocab, 5, replace=False).tolist())
                       for i in range(n)}
            logits = torch.randn(n, vocab, device=device)
            torch.cuda._sleep(200_000)  # a long forward pass before the mask
            expected.append((logits.clone(), {i: allowed[f"r{i}"] for i in range(n)}))
            mask.apply(logits, mask_message(step, allowed, vocab), list(allowed), np.arange(n))
            results.append(logits)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    for got, (before, keep) in zip(results, expected):
        assert torch.equal(got.cpu(), _expected(before.cpu(), keep))
