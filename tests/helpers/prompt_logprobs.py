"""Prompt logprobs from transformers, and the check of tprun's against them."""

from __future__ import annotations

import pytest
import torch


def hf_prompt_logprobs(model, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab] float64: row j is the distribution of prompt token j + 1."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, :-1]
    return torch.log_softmax(logits.double(), dim=-1)


def check_prompt_logprobs(got, prompt: list[int], want: torch.Tensor, k: int,
                          tol: float = 1e-4) -> None:
    assert len(got) == len(prompt)
    assert got[0] is None
    for j in range(1, len(prompt)):
        entry, ref, token = got[j], want[j - 1], prompt[j]
        top = torch.topk(ref, k).indices.tolist() if k else []
        assert set(entry) == set(top) | {token}, f"position {j}"
        for token_id, lp in entry.items():
            assert lp.logprob == pytest.approx(ref[token_id].item(), abs=tol)
        for rank, token_id in enumerate(top, start=1):
            assert entry[token_id].rank == rank
        assert entry[token].rank == int((ref >= ref[token] - 1e-9).sum())
