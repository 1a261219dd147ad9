"""The logprobs kernel (``runner/sampling/triton_logprobs.py``, compiled on
CUDA, else under the interpreter) against the torch reference: ranks and
the most likely token exactly, logprobs to rounding."""

from __future__ import annotations

import pytest
import torch

from runner.sampling.logprobs import compute_logprobs_ref
from runner.sampling.triton_logprobs import BLOCK, compute_logprobs_triton
from tests.helpers.kernel_device import KERNEL_DEVICE


def _rows(vocab: int, dtype: torch.dtype, seed: int):
    """Random rows; row 1 with -inf entries (a grammar's mask), row 2 with
    its maximum twice (the first is the most likely token) and the sampled
    token tied with others (they count against its rank), row 3 with its
    maximum last."""
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(4, vocab, generator=gen)
    logits[1, ::3] = float("-inf")
    logits[2] /= 10
    logits[2, [vocab // 2, vocab - 1]] = 20.0
    logits[2, [4, 9, 11]] = 1.25
    logits[3, -1] = 15.0  # a maximum in the last block: the sum is rescaled
    logits = logits.to(dtype)
    sampled = torch.tensor([7, 2, 9, vocab - 1])
    return logits, sampled


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [37, 3000, BLOCK + 500])
@pytest.mark.parametrize("num_top", [0, 1, 5])
def test_triton_logprobs_match_the_reference(dtype, vocab, num_top):
    logits, sampled = _rows(vocab, dtype, seed=vocab + num_top)
    want = compute_logprobs_ref(logits, sampled, num_top)
    got = compute_logprobs_triton(logits.to(KERNEL_DEVICE), sampled.to(KERNEL_DEVICE), num_top)
    assert torch.equal(got.sampled_ranks.cpu(), want.sampled_ranks)
    assert want.sampled_ranks[2] == 5  # the two maxima and two ties count against it
    torch.testing.assert_close(got.sampled_logprobs.cpu(), want.sampled_logprobs,
                               rtol=1e-5, atol=1e-5)
    assert got.top_token_ids.shape == (4, num_top)
    torch.testing.assert_close(got.top_logprobs.cpu(), want.top_logprobs, rtol=1e-5, atol=1e-5)
    if num_top == 1:  # the kernel's own: the first of two maxima
        assert got.top_token_ids[2, 0] == vocab // 2
    if num_top > 1:  # torch.topk's: the two maxima in either order
        assert set(got.top_token_ids[2, :2].tolist()) == {vocab // 2, vocab - 1}
    if num_top:
        rows = [0, 1, 3]
        assert torch.equal(got.top_token_ids.cpu()[rows], want.top_token_ids[rows])


def test_triton_logprobs_of_a_row_whose_first_block_is_masked():
    # The running sum starts only at the first finite logit (no -inf - -inf).
    vocab = BLOCK + 100
    logits = torch.full((1, vocab), float("-inf"))
    logits[0, BLOCK + 3:BLOCK + 9] = torch.arange(6, dtype=torch.float32)
    sampled = torch.tensor([BLOCK + 4])
    want = compute_logprobs_ref(logits, sampled, 2)
    got = compute_logprobs_triton(logits.to(KERNEL_DEVICE), sampled.to(KERNEL_DEVICE), 2)
    torch.testing.assert_close(got.sampled_logprobs.cpu(), want.sampled_logprobs)
    torch.testing.assert_close(got.top_logprobs.cpu(), want.top_logprobs)
    assert got.top_token_ids.tolist() == [[BLOCK + 8, BLOCK + 7]]
    assert got.sampled_ranks.tolist() == [5]
