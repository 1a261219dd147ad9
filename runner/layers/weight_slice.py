"""Where one checkpoint tensor lands in this rank's parameters."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WeightSlice:
    """Copy ``full[src_start : src_start + length]`` along ``dim`` of a checkpoint
    tensor into ``param[dst_start : dst_start + length]`` along the same ``dim``.

    All other dimensions are copied whole and must match the parameter's.
    ``full_size`` is the checkpoint tensor's size along ``dim``. A replicated
    tensor is the slice ``(dim=0, src_start=0, length=full_size=its size)``.
    """

    param: torch.Tensor
    dim: int
    src_start: int
    length: int
    full_size: int
    dst_start: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.src_start <= self.src_start + self.length <= self.full_size:
            raise ValueError(f"slice {self.src_start}+{self.length} exceeds size {self.full_size}")

    @classmethod
    def whole(cls, param: torch.Tensor) -> WeightSlice:
        """The entire tensor, replicated on every rank."""
        return cls(param, 0, 0, param.shape[0], param.shape[0])

    def source_shape(self) -> tuple[int, ...]:
        """Shape of the whole checkpoint tensor."""
        shape = list(self.param.shape)
        shape[self.dim] = self.full_size
        return tuple(shape)

    def destination(self) -> torch.Tensor:
        """The view of the parameter this slice fills."""
        return self.param.data.narrow(self.dim, self.dst_start, self.length)
