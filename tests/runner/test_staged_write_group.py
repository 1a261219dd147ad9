"""StagedWriteGroup: staged writes packed into one upload and applied in one launch.

Oracle: the same writes applied one by one, in staging order, to Python lists
(as in test_staged_write.py), for targets of every width the runner uses
(int32, float32, int64; 1-D and 2-D), through the torch reference and the
Triton kernel (interpreted on CPU, compiled on CUDA). The packing on its own:
its segments are disjoint and hold the later write where writes overlap.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from runner.ops import torch_ops, triton_ops
from runner.staged_write import StagedWriteTensor
from runner.staged_write_group import StagedWriteGroup, pack_grouped_writes
from runner.transfer import numpy_dtype

SHAPES = [((5, 30), torch.int32), ((7,), torch.float32), ((4, 3), torch.int64),
          ((9,), torch.int32), ((3, 50), torch.float32)]


def random_writes(rng: random.Random, shape: tuple[int, ...], count: int):
    """(row, start, values) writes, many overlapping; 1-D tensors get [n, 1] writes."""
    rows, cols = shape[0], shape[1] if len(shape) == 2 else 1
    writes = []
    for _ in range(count):
        length = rng.choice([0, 1, 1, 2, 5, 12, cols]) if cols > 1 else 1
        length = min(length, cols)
        start = rng.randint(0, cols - length)
        writes.append((rng.randrange(rows), start,
                       [rng.randrange(-10**6, 10**6) / (4 if rng.random() < 0.5 else 1)
                        for _ in range(length)]))
    return writes


def expected_after(table: list[list], writes, dtype: torch.dtype) -> None:
    for row, start, values in writes:
        cast = [int(v) if not dtype.is_floating_point else v for v in values]
        table[row][start: start + len(values)] = cast


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_group_applies_every_members_writes_in_staging_order(impl) -> None:
    rng = random.Random(7)
    device = "cuda" if impl == "triton" and torch.cuda.is_available() else "cpu"
    ops = (triton_ops if impl == "triton" else torch_ops)(torch.device(device))
    tensors = [StagedWriteTensor(shape, dtype, device) for shape, dtype in SHAPES]
    group = StagedWriteGroup(tensors)
    group._apply = ops.apply_grouped_writes  # on CPU: the interpreted kernel too
    expected = [[[0] * (s[1] if len(s) == 2 else 1) for _ in range(s[0])] for s, _ in SHAPES]
    for _ in range(8):
        for t, (shape, dtype), table in zip(tensors, SHAPES, expected):
            if rng.random() < 0.3:
                continue  # members without writes this step
            writes = random_writes(rng, shape, rng.randint(0, 12))
            for row, start, values in writes:
                if len(shape) == 2:
                    t.stage_write(row, start, values)
                else:
                    t.stage_write_elem(row, values[0])
            expected_after(table, writes, dtype)
        group.apply_writes()
        assert all(t.num_staged == 0 for t in tensors)
        for t, table in zip(tensors, expected):
            assert t.as_2d.cpu().tolist() == table


def unpack(packed) -> list[list[tuple[int, int, np.ndarray]]]:
    """Each target's (row, start, 32-bit words) writes, read back from the
    buffer as the kernel reads it (layout in runner/staged_write_group.py)."""
    header = packed.blob[: packed.words_offset].view(np.int64)
    words = packed.blob[packed.words_offset:].view(np.int32)
    t, n = packed.num_targets, packed.num_writes
    first = header[3 * t: 4 * t + 1]
    meta = header[4 * t + 1:]
    target, rows, starts, cu = meta[:n], meta[n: 2 * n], meta[2 * n: 3 * n], meta[3 * n:]
    out = [[] for _ in range(t)]
    for j in range(n):
        assert first[target[j]] <= j < first[target[j] + 1], "writes grouped by target"
        out[target[j]].append((int(rows[j]), int(starts[j]), words[cu[j]: cu[j + 1]]))
    return out


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.int64])
def test_packing_gives_disjoint_segments_with_later_writes_winning(dtype) -> None:
    """Many overlapping and touching writes to two targets of 6 x 40: the
    packed segments never overlap, cover exactly the written elements, and
    hold the value of the last write to each."""
    rng = random.Random(0)
    shape = (6, 40)
    for _ in range(30):
        dsts = [torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=torch.int32)]
        staged = [random_writes(rng, shape, rng.randint(1, 60)) for _ in dsts]
        packed = pack_grouped_writes([
            (dst, [(r, s, np.array(v, dtype=numpy_dtype(dst.dtype))) for r, s, v in writes])
            for dst, writes in zip(dsts, staged)])
        for dst, writes, segments in zip(dsts, staged, unpack(packed)):
            covered, table = set(), [[0] * shape[1] for _ in range(shape[0])]
            for row, start, seg_words in segments:
                values = seg_words.copy().view(numpy_dtype(dst.dtype)).tolist()
                cells = {(row, start + k) for k in range(len(values))}
                assert not cells & covered, "packed writes overlap"
                covered |= cells
                table[row][start: start + len(values)] = values
            expected = [[0] * shape[1] for _ in range(shape[0])]
            expected_after(expected, writes, dst.dtype)
            assert table == expected
            assert covered == {(r, s + k) for r, s, v in writes for k in range(len(v))}


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_kernel_leaves_unwritten_elements_and_matches_one_by_one(impl) -> None:
    """The packed writes of many steps applied straight through the kernel
    to targets that start at -777, not zero: every element no write covers
    keeps -777, every other holds its last write (full-width writes included)."""
    rng = random.Random(1)
    device = "cuda" if impl == "triton" and torch.cuda.is_available() else "cpu"
    apply = (triton_ops if impl == "triton" else torch_ops)(torch.device(device)).apply_grouped_writes
    shapes = [((6, 40), torch.int64), ((6, 40), torch.int32), ((5, 1), torch.float32)]
    dsts = [torch.full(shape, -777, dtype=dtype, device=device) for shape, dtype in shapes]
    expected = [[[-777] * shape[1] for _ in range(shape[0])] for shape, _ in shapes]
    for _ in range(12):
        staged = [random_writes(rng, shape, rng.randint(0, 40)) for shape, _ in shapes]
        packed = pack_grouped_writes([
            (dst, [(r, s, np.array(v)) for r, s, v in writes])
            for dst, writes in zip(dsts, staged)])
        blob = torch.from_numpy(packed.blob).to(device)
        apply(dsts, blob, packed.words_offset, packed.num_writes)
        for table, writes, (_, dtype) in zip(expected, staged, shapes):
            expected_after(table, writes, dtype)
        assert [dst.cpu().tolist() for dst in dsts] == expected


def test_packed_layout() -> None:
    """A hand-worked case: two targets, three writes (one overlap resolved)."""
    a = torch.zeros(2, 4, dtype=torch.int32)
    b = torch.zeros(3, 1, dtype=torch.int64)
    packed = pack_grouped_writes([
        (a, [(1, 0, np.array([1, 2])), (1, 1, np.array([5, 6, 7]))]),
        (b, [(2, 0, np.array([-3]))]),
    ])
    assert (packed.num_targets, packed.num_writes) == (2, 2)
    header = packed.blob[: packed.words_offset].view(np.int64)
    assert header.tolist() == [
        a.data_ptr(), b.data_ptr(),  # addresses
        16, 8,  # bytes between rows
        4, 8,  # bytes per element
        0, 1, 2,  # first write of each target, then the end
        0, 1,  # target of each write
        1, 2,  # rows
        0, 0,  # starts
        0, 4, 6,  # cu_words: 4 int32 words, then one int64 as 2 words
    ]
    words = packed.blob[packed.words_offset:].view(np.int32)
    assert words[:4].tolist() == [1, 5, 6, 7]
    assert words[4:].view(np.int64).tolist() == [-3]


def test_targets_must_be_4_or_8_bytes_wide() -> None:
    ops = torch_ops(torch.device("cpu"))
    with pytest.raises(ValueError, match="4- or 8-byte"):
        ops.apply_grouped_writes([torch.zeros(2, 2, dtype=torch.int16)],
                                 torch.zeros(64, dtype=torch.uint8), 48, 0)
    with pytest.raises(ValueError, match="at least one"):
        StagedWriteGroup([])
