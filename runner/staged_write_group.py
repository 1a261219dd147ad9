"""StagedWriteGroup: the staged writes of StagedWriteTensors in one upload and one launch.

Every staged write reaches the device here. A step that adds a request
stages writes to about eight persistent tensors (its prompt, lengths,
block-table row, sampling parameters); applied one tensor at a time, each
would cost a host pack, an upload and a kernel launch, and the first token
of a request would wait for all of them. The runner's one group packs every
member's writes into one host buffer, uploads it in one copy
(``runner.transfer``: non_blocking from a pinned ring on CUDA) and applies
them with one launch, whose programs write through each target's address
(the Triton kernel) or one scatter per target (the torch reference). The
kernel reads the uploaded buffer as it is (header and words found by byte
offset), and the group checks its targets once when it is built, so the
host's share of a step's writes is the packing, one copy and one launch.

Layout of the packed buffer: int64 words, then the values as 32-bit words
(every target's dtype is 4 or 8 bytes wide, so each value is one or two
words and the copy needs no conversion). With T targets and n writes:
  [0, T)           address of each target's first element
  [T, 2T)          bytes between the rows of each target
  [2T, 3T)         bytes per element of each target
  [3T, 4T + 1)     first write of each target (writes are grouped by target)
  [4T + 1, +n)     the target of each write
  then rows (n), starts (n, in elements) and cu_words (n + 1): write j
  copies words[cu_words[j] : cu_words[j + 1]] to row rows[j] of its target
  from element starts[j].
The words start at a multiple of 16 bytes.

Invariants:
- Writes to one tensor apply in staging order: where two staged writes hit
  the same element, the later one wins. The host resolves overlaps while
  packing (``_disjoint``: writes that overlap or touch become one segment),
  so the device writes are disjoint and the order in which the kernel's
  programs run does not matter.
- Nothing here waits for the device (the upload stages its source in a
  pinned buffer that is reused only after its copy has run; see
  ``runner.transfer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from runner.ops import device_ops, unchecked
from runner.transfer import numpy_dtype

if TYPE_CHECKING:
    from runner.staged_write import StagedWriteTensor


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
              ) -> list[tuple[int, int, np.ndarray]]:
    """(row, start, values) writes in staging order, made disjoint: where
    two overlap, the later one's values win. Empty writes are dropped.
    Writes to distinct rows (a step's usual case) are disjoint already and
    pass through as they are."""
    if len({row for row, _, _ in writes}) == len(writes):
        return [w for w in writes if len(w[2]) > 0]
    by_row: dict[int, list[tuple[int, np.ndarray]]] = {}
    for row, start, values in writes:
        if len(values) > 0:
            by_row.setdefault(row, []).append((start, values))
    return [(row, start, values) for row, row_writes in by_row.items()
            for start, values in _merge_row(row_writes)]


@dataclass(frozen=True)
class PackedGroup:
    """One host buffer holding a group's writes (layout in the module docstring)."""

    blob: np.ndarray  # uint8
    num_targets: int
    num_writes: int
    words_offset: int


def target_entry(dst: torch.Tensor) -> tuple[int, int, int]:
    """A target's header entry: (address, bytes between rows, bytes per
    element); fixed for the tensor's life."""
    size = dst.element_size()
    return dst.data_ptr(), dst.stride(0) * size, size


def pack_grouped_writes(
    targets: Sequence[tuple[torch.Tensor, Sequence[tuple[int, int, np.ndarray]]]],
) -> PackedGroup:
    """Pack each target's (row, start, values) writes, given in staging order,
    into one buffer. A target is a 2-D tensor with contiguous rows whose
    elements are 4 or 8 bytes wide; values are converted to its dtype."""
    return pack_entries([
        (target_entry(dst), [(row, start, np.ascontiguousarray(v, numpy_dtype(dst.dtype)).ravel())
                             for row, start, v in writes])
        for dst, writes in targets])


def pack_entries(
    targets: Sequence[tuple[tuple[int, int, int], Sequence[tuple[int, int, np.ndarray]]]],
) -> PackedGroup:
    """``pack_grouped_writes`` for targets given by their ``target_entry``,
    whose values are contiguous 1-D arrays of the target's dtype already
    (a ``StagedWriteTensor`` stages them so).

    The header is gathered in one Python list and written with one
    conversion, the values with one concatenation: a step's few writes cost
    a handful of numpy calls, not a few per write."""
    addresses, row_bytes, elem_bytes, first = [], [], [], [0]
    target_of, rows, starts, cu_words, chunks = [], [], [], [0], []
    num_words = 0
    for t, ((address, row_size, elem_size), writes) in enumerate(targets):
        addresses.append(address)
        row_bytes.append(row_size)
        elem_bytes.append(elem_size)
        if len(writes) != 1:
            writes = _disjoint(writes)
        elif len(writes[0][2]) == 0:  # one write: disjoint already, unless empty
            writes = ()
        for row, start, values in writes:
            target_of.append(t)
            rows.append(row)
            starts.append(start)
            num_words += values.nbytes // 4
            cu_words.append(num_words)
            chunks.append(values.view(np.int32))
        first.append(len(rows))
    header = addresses + row_bytes + elem_bytes + first + target_of + rows + starts + cu_words
    words_offset = -(-8 * len(header) // 16) * 16
    blob = np.empty(words_offset + 4 * num_words, dtype=np.uint8)
    blob[: 8 * len(header)].view(np.int64)[:] = header
    if chunks:
        np.concatenate(chunks, out=blob[words_offset:].view(np.int32))
    return PackedGroup(blob=blob, num_targets=len(targets), num_writes=len(rows),
                       words_offset=words_offset)


def check_targets(dsts: Sequence[torch.Tensor]) -> None:
    """Raise ValueError unless every target is 2-D with contiguous rows and
    4- or 8-byte elements."""
    for dst in dsts:
        if dst.dim() != 2 or dst.stride(1) != 1 or dst.element_size() not in (4, 8):
            raise ValueError("grouped writes need 2-D targets with contiguous rows of "
                             f"4- or 8-byte elements, got {tuple(dst.shape)} {dst.dtype}")


def check_apply_grouped_writes(dsts: list[torch.Tensor], blob: torch.Tensor,
                               words_offset: int, num_writes: int) -> None:
    """Raise ValueError unless every target fits (``check_targets``) and
    ``blob`` (uint8) holds a header for every target and write before its
    words, which start 16-byte aligned."""
    check_targets(dsts)
    header_bytes = 8 * (4 * len(dsts) + 4 * num_writes + 2)
    if (blob.dtype != torch.uint8 or blob.dim() != 1 or words_offset % 16
            or not header_bytes <= words_offset <= blob.shape[0]):
        raise ValueError("the buffer does not hold a header for every target and write")


def _scatter(dst: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor,
             cu_lens: torch.Tensor, values: torch.Tensor) -> None:
    """values[cu_lens[j] : cu_lens[j + 1]] into dst[rows[j], starts[j] : ...]
    for every write j, as one indexed store (the writes are disjoint)."""
    j = torch.arange(values.shape[0], device=dst.device, dtype=torch.int64)
    write = torch.searchsorted(cu_lens[1:], j, right=True)
    dst[rows[write], starts[write] + (j - cu_lens[write])] = values


def apply_grouped_writes_ref(dsts: list[torch.Tensor], blob: torch.Tensor, words_offset: int,
                             num_writes: int) -> None:
    """Torch reference: one scatter per target over the target's writes;
    the address table is not used."""
    header = blob[:words_offset].view(torch.int64)
    words = blob[words_offset:].view(torch.int32)
    num_targets = len(dsts)
    first = header[3 * num_targets: 4 * num_targets + 1].tolist()
    n = first[-1]
    meta = header[4 * num_targets + 1:]
    rows, starts, cu_words = meta[n: 2 * n], meta[2 * n: 3 * n], meta[3 * n: 4 * n + 1]
    for t, dst in enumerate(dsts):
        lo, hi = first[t], first[t + 1]
        if lo == hi:
            continue
        per_value = dst.element_size() // 4
        w0, w1 = int(cu_words[lo]), int(cu_words[hi])
        values = words[w0:w1].clone().view(dst.dtype)  # a copy: 8-byte values may sit unaligned
        cu_lens = (cu_words[lo: hi + 1] - w0) // per_value
        _scatter(dst, rows[lo:hi], starts[lo:hi], cu_lens, values)


class StagedWriteGroup:
    """StagedWriteTensors of one device whose staged writes apply together."""

    def __init__(self, tensors: Sequence[StagedWriteTensor], reserve_bytes: int = 0) -> None:
        """``reserve_bytes``: the packed size of a usual step's writes, staged
        for upload without growing a buffer (``HostTransfer.reserve``)."""
        if not tensors:
            raise ValueError("a StagedWriteGroup needs at least one tensor")
        ops = device_ops(tensors[0].gpu.device)
        self.tensors = list(tensors)
        self._entries = [target_entry(t.as_2d) for t in self.tensors]
        self.transfer = ops.new_transfer()
        self.transfer.reserve(upload_bytes=reserve_bytes)
        # The targets are checked once, here; the buffers are packed here:
        # each step's launch skips the kernel's check.
        check_targets([t.as_2d for t in self.tensors])
        self._apply = unchecked(ops.apply_grouped_writes)

    def apply_writes(self, extra: tuple[RowTarget, np.ndarray] | None = None) -> bool:
        """Apply every member's staged writes with one upload and one launch;
        never waits. ``extra`` = (target, values): one more write, of
        ``values`` (the target's dtype, 1-D) to row 0 of a tensor outside
        the group from element 0, carried by that launch when there is one
        (the step's input meta, which then needs no copy of its own).
        Returns whether it launched: False when nothing was staged, and
        ``extra`` is then not written."""
        members = [i for i, t in enumerate(self.tensors) if t.num_staged]
        if not members:
            return False
        targets = [(self._entries[i], self.tensors[i].take_writes()) for i in members]
        dsts = [self.tensors[i].as_2d for i in members]
        if extra is not None:
            targets.append((extra[0].entry, [(0, 0, extra[1])]))
            dsts.append(extra[0].dst)
        packed = pack_entries(targets)
        if packed.num_writes == 0:  # only empty writes were staged
            return False
        (blob,) = self.transfer.upload(packed.blob)
        self._apply(dsts, blob, packed.words_offset, packed.num_writes)
        return True


class RowTarget:
    """A 2-D tensor outside a group that its launch may write too
    (``StagedWriteGroup.apply_writes``): checked and entered once."""

    def __init__(self, dst: torch.Tensor) -> None:
        check_targets([dst])
        self.dst = dst
        self.entry = target_entry(dst)
