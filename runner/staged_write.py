"""StagedWriteTensor: host-staged writes to a device tensor, applied in one launch.

Request states change on the host (new request: its prompt and lengths; new
KV blocks: block-table entries), but the tensors they change live on the
device. Writing each change with its own tiny copy would cost a launch per
change. Instead the writes are staged on the host and apply_write() packs them
into flat arrays (rows, starts, cu_lens, values) that share one host buffer,
uploads that buffer in one copy (``runner.transfer``: non_blocking from
pinned memory on CUDA), and applies them all with one kernel launch (the
torch reference on CPU).

Invariants:
- Writes apply in staging order: where two staged writes hit the same
  element, the later one wins (pack_writes resolves overlaps on the host, so
  the device writes are disjoint and their order does not matter).
- Nothing here waits for the device (the upload stages its sources in
  pinned buffers that are reused only after their copy has run; see
  ``runner.transfer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from runner.ops import device_ops
from runner.transfer import numpy_dtype


@dataclass(frozen=True)
class PackedWrites:
    """Disjoint writes: values[cu_lens[j]:cu_lens[j+1]] go to row rows[j] from column starts[j].

    All four arrays are views of ``blob``, one host buffer: int64 rows,
    starts and cu_lens back to back from byte 0, then ``values`` from byte
    ``values_offset`` (a multiple of 16, so every view stays aligned). One
    upload of ``blob`` carries the whole step's writes of a tensor.
    """

    rows: np.ndarray
    starts: np.ndarray
    cu_lens: np.ndarray
    values: np.ndarray
    blob: np.ndarray  # uint8
    values_offset: int


def _merge_row(writes: list[tuple[int, np.ndarray]]) -> list[tuple[int, np.ndarray]]:
    """One row's writes (staging order) as disjoint segments; later writes win."""
    if len(writes) == 1:
        return writes
    order = sorted(range(len(writes)), key=lambda w: writes[w][0])
    cluster_of = [0] * len(writes)
    bounds: list[list[int]] = []  # [start, end) of each cluster of touching writes
    for w in order:
        start, end = writes[w][0], writes[w][0] + len(writes[w][1])
        if bounds and start <= bounds[-1][1]:
            bounds[-1][1] = max(bounds[-1][1], end)
        else:
            bounds.append([start, end])
        cluster_of[w] = len(bounds) - 1
    dtype = writes[0][1].dtype
    merged = [np.empty(end - start, dtype=dtype) for start, end in bounds]
    for w, (start, values) in enumerate(writes):  # staging order: later overwrites
        c = cluster_of[w]
        offset = start - bounds[c][0]
        merged[c][offset : offset + len(values)] = values
    return [(start, values) for (start, _), values in zip(bounds, merged)]


def _disjoint(writes: Sequence[tuple[int, int, np.ndarray]]
              ) -> tuple[list[int], list[int], list[np.ndarray]]:
    """(rows, starts, values) of (row, start, values) writes in staging order,
    made disjoint: where two overlap, the later one's values win."""
    by_row: dict[int, list[tuple[int, np.ndarray]]] = {}
    for row, start, values in writes:
        if len(values) > 0:
            by_row.setdefault(row, []).append((start, values))
    rows, starts, chunks = [], [], []
    for row, row_writes in by_row.items():
        for start, values in _merge_row(row_writes):
            rows.append(row)
            starts.append(start)
            chunks.append(values)
    return rows, starts, chunks


def pack_writes(writes: Sequence[tuple[int, int, np.ndarray]], dtype: np.dtype) -> PackedWrites:
    """Pack (row, start, values) writes, in staging order, into disjoint flat arrays."""
    rows, starts, chunks = _disjoint(writes)
    n = len(chunks)
    lens = [len(c) for c in chunks]
    dtype = np.dtype(dtype)
    values_offset = -(-8 * (3 * n + 1) // 16) * 16
    blob = np.empty(values_offset + sum(lens) * dtype.itemsize, dtype=np.uint8)
    meta = blob[: 8 * (3 * n + 1)].view(np.int64)
    meta[:n] = rows
    meta[n : 2 * n] = starts
    meta[2 * n] = 0
    meta[2 * n + 1 :] = lens
    np.cumsum(meta[2 * n + 1 :], out=meta[2 * n + 1 :])
    values = blob[values_offset:].view(dtype)
    if chunks:
        np.concatenate(chunks, out=values, casting="unsafe")
    return PackedWrites(rows=meta[:n], starts=meta[n : 2 * n], cu_lens=meta[2 * n :],
                        values=values, blob=blob, values_offset=values_offset)


def check_apply_staged_writes(dst: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor,
                              cu_lens: torch.Tensor) -> None:
    """Raise ValueError unless the packed writes fit ``dst``.

    Write j puts values[cu_lens[j] : cu_lens[j+1]] into dst[rows[j], starts[j] : ...].
    The writes must not overlap (pack_writes resolves overlaps on the host, so
    the order in which they apply does not matter). rows, starts and cu_lens
    are int64; values has dst's dtype; dst is 2-D with contiguous rows (a 1-D
    tensor is passed as a [n, 1] view).
    """
    if dst.dim() != 2 or dst.stride(1) != 1:
        raise ValueError(f"dst must be 2-D with contiguous rows, got shape {tuple(dst.shape)}")
    if rows.shape[0] != starts.shape[0] or cu_lens.shape[0] != rows.shape[0] + 1:
        raise ValueError("rows, starts need n entries and cu_lens n + 1")


def apply_staged_writes_ref(dst: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor,
                            cu_lens: torch.Tensor, values: torch.Tensor) -> None:
    """Torch reference: one scatter over all written elements, no sync."""
    num_values = values.shape[0]
    if rows.shape[0] == 0 or num_values == 0:
        return
    j = torch.arange(num_values, device=dst.device, dtype=torch.int64)
    write = torch.searchsorted(cu_lens[1:], j, right=True)
    cols = starts[write] + (j - cu_lens[write])
    dst[rows[write], cols] = values


class StagedWriteTensor:
    """A device tensor (``.gpu``) whose updates are staged on the host.

    shape is (rows,) or (rows, cols). With uva=True on CUDA, ``.gpu`` is a
    device view of pinned host memory (see runner.transfer); on a CPU device it
    is a plain CPU tensor. Starts zero-filled.
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
        self.shape = tuple(shape)
        self.dtype = dtype
        self.np_dtype = numpy_dtype(dtype)
        ops = device_ops(device)
        self._apply = ops.apply_staged_writes
        self.transfer = ops.new_transfer()
        self.gpu = self.transfer.device_tensor(self.shape, dtype, uva)
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
        the caller to apply (``StagedWriteGroup``); none stay staged."""
        writes, self._writes = self._writes, []
        return writes

    @property
    def num_staged(self) -> int:
        """Number of writes staged since the last apply_write()."""
        return len(self._writes)

    def apply_write(self) -> None:
        """Apply all staged writes, in staging order, with one launch; never waits."""
        if not self._writes:
            return
        packed = pack_writes(self.take_writes(), self.np_dtype)
        if len(packed.rows) == 0:  # only empty writes were staged
            return
        (blob,) = self.transfer.upload(packed.blob)
        n, offset = len(packed.rows), packed.values_offset
        meta = blob[: 8 * (3 * n + 1)].view(torch.int64)
        values = blob[offset:].view(self.dtype)
        self._apply(self._as_2d, meta[:n], meta[n : 2 * n], meta[2 * n :], values)
