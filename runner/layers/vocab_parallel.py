"""Vocabulary-parallel input embedding and LM head.

The vocabulary is padded to a multiple of 64 * tp rows and split evenly:
rank r holds rows r * n .. (r + 1) * n of the padded table. Padding rows are
zero and cut off the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runner.distributed import TensorParallelGroup
from runner.layers.weight_slice import WeightSlice
from runner.ops import device_ops

PAD_MULTIPLE = 64


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    """Smallest multiple of PAD_MULTIPLE * tp_size that holds the vocabulary."""
    multiple = PAD_MULTIPLE * tp_size
    return -(-vocab_size // multiple) * multiple


class VocabParallelEmbedding(nn.Module):
    """Embedding whose rows are split over the ranks; forward all_reduces."""

    def __init__(self, vocab_size: int, embedding_dim: int, tp: TensorParallelGroup,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        rows = padded_vocab_size(vocab_size, tp.size) // tp.size
        self.vocab_start = tp.rank * rows
        self.vocab_end = self.vocab_start + rows
        self.weight = nn.Parameter(torch.zeros(rows, embedding_dim, dtype=dtype),
                                   requires_grad=False)

    def weight_slices(self) -> WeightSlice | None:
        """This rank's real rows of the checkpoint table, or None if it holds only padding."""
        length = min(self.vocab_end, self.vocab_size) - self.vocab_start
        return (WeightSlice(self.weight, 0, self.vocab_start, length, self.vocab_size)
                if length > 0 else None)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(mine, input_ids - self.vocab_start, 0)
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.all_reduce(out)


class ParallelLMHead(nn.Module):
    """Logits over the full vocabulary on every rank (local matmul, then all_gather).

    With tied embeddings it reuses the embedding's parameter. The local
    matmul is the device's ``lm_head_matmul`` (``runner/ops.py``; on CUDA
    ``triton_skinny_matmul.lm_head_matmul`` says which kernel takes which
    row count).
    """

    def __init__(self, embedding: VocabParallelEmbedding, tied: bool) -> None:
        super().__init__()
        self.tp = embedding.tp
        self.vocab_size = embedding.vocab_size
        self.vocab_start = embedding.vocab_start
        self.vocab_end = embedding.vocab_end
        self.weight = embedding.weight if tied else nn.Parameter(
            torch.zeros_like(embedding.weight), requires_grad=False)
        self.ops = device_ops(self.weight.device)

    def weight_slices(self) -> WeightSlice | None:
        length = min(self.vocab_end, self.vocab_size) - self.vocab_start
        return (WeightSlice(self.weight, 0, self.vocab_start, length, self.vocab_size)
                if length > 0 else None)

    def forward(self, hidden: torch.Tensor,
                dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
        """hidden [N, H] -> logits [N, vocab_size] in ``dtype`` (None: the
        weight's, as the projection rounds them)."""
        local = self.ops.lm_head_matmul(hidden, self.weight)
        full = self.tp.all_gather(local, dim=-1)[:, : self.vocab_size]
        return full if dtype is None else full.to(dtype)
