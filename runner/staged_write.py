"""StagedWriteTensor: a device tensor whose writes are staged on the host.

Request states change on the host (new request: its prompt and lengths; new
KV blocks: block-table entries), but the tensors they change live on the
device. Writing each change with its own tiny copy would cost a launch per
change. Instead ``stage_write`` / ``stage_write_elem`` record the write on
the host (a copy of its values, so the caller may reuse its array) and a
``StagedWriteGroup`` (runner/staged_write_group.py) later applies the
staged writes of all its members with one upload and one launch (the
runner's one group holds every such tensor). The group's docstring states the
invariants (staging order, the later write winning on overlap, no wait for
the device).

Elements are 4 or 8 bytes wide (int32, float32, int64, float64): the group
copies values as 32-bit words.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from runner.ops import device_ops
from runner.transfer import numpy_dtype


class StagedWriteTensor:
    """A device tensor (``.gpu``) whose updates are staged on the host.

    shape is (rows,) or (rows, cols). With uva=True on CUDA, ``.gpu`` is a
    device view of pinned host memory (see runner.transfer); on a CPU device it
    is a plain CPU tensor. Starts zero-filled. dtype is 4 or 8 bytes wide.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device | str,
        uva: bool = False,
    ) -> None:
        if len(shape) not in (1, 2) or any(n <= 0 for n in shape):
            raise ValueError(f"shape must be (rows,) or (rows, cols) of positive sizes: {shape}")
        self.np_dtype = numpy_dtype(dtype)
        if self.np_dtype.itemsize not in (4, 8):
            raise ValueError(f"staged writes need a dtype of 4 or 8 bytes, got {dtype}")
        self.shape = tuple(shape)
        self.dtype = dtype
        self.gpu = device_ops(device).new_transfer().device_tensor(self.shape, dtype, uva)
        self._as_2d = self.gpu if self.gpu.dim() == 2 else self.gpu.view(-1, 1)
        self._writes: list[tuple[int, int, np.ndarray]] = []

    def stage_write(self, row: int, start: int, values: Sequence[int] | np.ndarray) -> None:
        """Stage gpu[row, start : start + len(values)] = values (2-D tensors)."""
        if len(self.shape) != 2:
            raise ValueError("stage_write needs a 2-D tensor; use stage_write_elem")
        array = np.array(values, dtype=self.np_dtype).reshape(-1)  # a copy: caller may reuse
        self._check(row, start, len(array))
        self._writes.append((row, start, array))

    def stage_write_elem(self, row: int, value: int | float) -> None:
        """Stage gpu[row] = value (1-D) or gpu[row, 0] = value (2-D)."""
        self._check(row, 0, 1)
        self._writes.append((row, 0, np.array([value], dtype=self.np_dtype)))

    def _check(self, row: int, start: int, length: int) -> None:
        cols = self._as_2d.shape[1]
        if not 0 <= row < self.shape[0]:
            raise ValueError(f"row {row} outside [0, {self.shape[0]})")
        if start < 0 or start + length > cols:
            raise ValueError(f"columns [{start}, {start + length}) outside [0, {cols})")

    @property
    def as_2d(self) -> torch.Tensor:
        """``.gpu`` as a 2-D tensor (a 1-D one as its [n, 1] view)."""
        return self._as_2d

    def take_writes(self) -> list[tuple[int, int, np.ndarray]]:
        """The staged (row, start, values) writes in staging order, handed to
        the group that applies them; none stay staged."""
        writes, self._writes = self._writes, []
        return writes

    @property
    def num_staged(self) -> int:
        """Number of writes staged since they were last applied."""
        return len(self._writes)
