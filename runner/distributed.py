"""The tensor-parallel group the model's layers talk through.

Every collective of the model goes through one ``TensorParallelGroup``: the
layers call ``all_reduce`` (row-parallel outputs, vocab-parallel embedding)
and ``all_gather`` (vocab-parallel logits). At size 1 both are free and no
process group is needed, so the same model code runs in a single process.

On CUDA the group may carry ``PeerBuffers`` (custom_all_reduce.py): the
one-shot all-reduce over peer memory for the messages it can hold, fused with
the residual add and RMSNorm where the decoder asks for that
(``all_reduce_add_rms_norm``); everything else goes through NCCL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from runner.custom_all_reduce import PeerBuffers

logger = logging.getLogger(__name__)


def every_rank_agrees(ok: bool, device: torch.device) -> bool:
    """Whether ``ok`` holds on every rank of the default group (a collective:
    every rank calls it and all get the same answer)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


@dataclass(frozen=True)
class TensorParallelGroup:
    """Rank ``rank`` of ``size`` ranks sharing torch.distributed's default group.

    Invariant: 0 <= rank < size; at size > 1 the default process group is
    initialized and its world is exactly this group.
    """

    rank: int = 0
    size: int = 1
    peer: PeerBuffers | None = field(default=None, compare=False, repr=False)

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

    def with_peer_buffers(self, device: torch.device) -> TensorParallelGroup:
        """This group plus the one-shot all-reduce over peer memory (a collective).

        Only for CUDA groups of more than one rank, otherwise the group itself
        (NCCL or gloo does every reduction). The GPUs must be able to map each
        other's memory (NVLink or PCIe peer access); where one rank's cannot,
        every rank keeps NCCL for every all-reduce (they decide together, so
        no rank waits in a rendezvous the others skipped).
        """
        from runner.ops import device_ops

        if self.size == 1 or device_ops(device).dist_backend != "nccl":
            return self
        from runner.custom_all_reduce import PeerBuffers

        if not every_rank_agrees(PeerBuffers.reachable(device), device):
            logger.warning("rank %d: a GPU of the group cannot map its peers' memory: "
                           "NCCL for every all-reduce", self.rank)
            return self
        return TensorParallelGroup(self.rank, self.size, PeerBuffers.create(device))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks; returns the sum (``x`` itself on the NCCL path)."""
        if self.size == 1:
            return x
        rows = x.reshape(-1, x.shape[-1])
        if self.peer is not None and self.peer.takes(rows):
            return self.peer.all_reduce(rows).view(x.shape)
        dist.all_reduce(x)
        return x

    def all_reduce_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor,
        add_rms_norm: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        weight: torch.Tensor, eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(sum(x) + residual), sum(x) + residual) for a rank's partial ``x``.

        One launch where the peer buffers take ``x``; else all_reduce, then
        ``add_rms_norm`` (the norm's own add-then-norm).
        """
        rows = x.reshape(-1, x.shape[-1])
        if self.size > 1 and self.peer is not None and self.peer.takes(rows):
            out, res = self.peer.all_reduce_add_rms_norm(
                rows, residual.view(rows.shape), weight, eps)
            return out.view(x.shape), residual
        return add_rms_norm(self.all_reduce(x), residual)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim``, in rank order."""
        if self.size == 1:
            return x
        x = x.contiguous()
        shards = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(shards, x)
        return torch.cat(shards, dim=dim)
