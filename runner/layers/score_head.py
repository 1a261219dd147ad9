"""A sequence classifier's score head: ``score.weight`` [num_labels, hidden],
no bias (Hugging Face's ``*ForSequenceClassification``).

The weight is num_labels rows of the hidden size, small next to any
projection, so every rank holds it whole (replicated, as vLLM keeps it):
the head runs on the pooled rows after the model, whose hidden states are
the same on every rank, and needs no collective. It projects in float32,
so only ``num_labels`` float32 values per request leave the device.
"""

from __future__ import annotations

import torch
from torch import nn

from runner.layers.weight_slice import WeightSlice


class ScoreHead(nn.Module):
    """pooled [N, hidden] -> float32 logits [N, num_labels]."""

    def __init__(self, hidden_size: int, num_labels: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_labels, hidden_size, dtype=dtype),
                                   requires_grad=False)

    def weight_slices(self) -> WeightSlice:
        return WeightSlice.whole(self.weight)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled.float() @ self.weight.float().t()
