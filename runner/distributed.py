"""The tensor-parallel group the model's layers talk through.

Every collective of the model goes through one ``TensorParallelGroup``: the
layers call ``all_reduce`` (row-parallel outputs, vocab-parallel embedding)
and ``all_gather`` (vocab-parallel logits). At size 1 both are free and no
process group is needed, so the same model code runs in a single process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallelGroup:
    """Rank ``rank`` of ``size`` ranks sharing torch.distributed's default group.

    Invariant: 0 <= rank < size; at size > 1 the default process group is
    initialized and its world is exactly this group.
    """

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"tensor-parallel size must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is outside tensor-parallel size {self.size}")

    @classmethod
    def from_default_group(cls) -> TensorParallelGroup:
        """Rank and size of the initialized default group, else a group of one."""
        if dist.is_available() and dist.is_initialized():
            return cls(rank=dist.get_rank(), size=dist.get_world_size())
        return cls()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns ``x``."""
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim``, in rank order."""
        if self.size == 1:
            return x
        x = x.contiguous()
        shards = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(shards, x)
        return torch.cat(shards, dim=dim)
