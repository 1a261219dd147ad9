"""StagedWriteTensor staging, applied through a StagedWriteGroup of the
tensor alone, and UVA views. The packing and the grouped-write kernel are tested in
test_staged_write_group.py.

Oracle: the same writes applied one by one, in staging order, to Python lists.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from runner.ops import triton_ops
from runner.staged_write import StagedWriteTensor
from runner.staged_write_group import StagedWriteGroup

ROWS, COLS = 6, 40


def random_writes(rng: random.Random, count: int) -> list[tuple[int, int, list[int]]]:
    """Interleaved writes; few rows and short rows, so many overlap or touch."""
    writes = []
    for _ in range(count):
        row = rng.randrange(ROWS)
        length = rng.choice([0, 1, 1, 2, 5, 12, COLS])
        start = rng.randint(0, COLS - length)
        writes.append((row, start, [rng.randrange(-1000, 1000) for _ in range(length)]))
    return writes


def apply_one_by_one(table: list[list[int]], writes) -> None:
    for row, start, values in writes:
        table[row][start : start + len(values)] = values


def test_staged_write_tensor_2d_applies_in_staging_order() -> None:
    rng = random.Random(2)
    t = StagedWriteTensor((ROWS, COLS), torch.int32, "cpu")
    group = StagedWriteGroup([t])
    assert t.gpu.tolist() == [[0] * COLS for _ in range(ROWS)]
    expected = [[0] * COLS for _ in range(ROWS)]
    for _ in range(10):
        staged = []
        for row, start, values in random_writes(rng, rng.randint(0, 50)):
            if rng.random() < 0.2:
                t.stage_write_elem(row, values[0] if values else 5)
                staged.append((row, 0, [values[0] if values else 5]))
            else:
                t.stage_write(row, start, np.array(values) if rng.random() < 0.5 else values)
                staged.append((row, start, values))
        assert t.num_staged == len(staged)
        before = t.gpu.clone()
        apply_one_by_one(expected, staged)
        assert torch.equal(t.gpu, before), "stage_* must not touch the tensor"
        group.apply_writes()
        assert t.num_staged == 0
        assert t.gpu.tolist() == expected


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_staged_write_tensor_1d_elements(dtype: torch.dtype) -> None:
    rng = random.Random(3)
    t = StagedWriteTensor((17,), dtype, "cpu")
    group = StagedWriteGroup([t])
    expected = [0] * 17
    for _ in range(5):
        for _ in range(rng.randint(0, 30)):
            row, value = rng.randrange(17), rng.randrange(-50, 50)
            t.stage_write_elem(row, value)
            expected[row] = value
        group.apply_writes()
        assert t.gpu.tolist() == expected


def test_staged_values_are_copied_at_staging() -> None:
    t = StagedWriteTensor((2, 4), torch.int32, "cpu")
    group = StagedWriteGroup([t])
    values = np.array([1, 2, 3], dtype=np.int32)
    t.stage_write(1, 1, values)
    values[:] = 9
    group.apply_writes()
    assert t.gpu.tolist() == [[0, 0, 0, 0], [0, 1, 2, 3]]


def test_bad_writes_raise_value_error() -> None:
    t2 = StagedWriteTensor((2, 4), torch.int32, "cpu")
    t1 = StagedWriteTensor((3,), torch.int32, "cpu")
    with pytest.raises(ValueError, match="row"):
        t2.stage_write(2, 0, [1])
    with pytest.raises(ValueError, match="columns"):
        t2.stage_write(0, 2, [1, 2, 3])
    with pytest.raises(ValueError, match="columns"):
        t2.stage_write(0, -1, [1])
    with pytest.raises(ValueError, match="2-D"):
        t1.stage_write(0, 0, [1])
    with pytest.raises(ValueError, match="row"):
        t1.stage_write_elem(-1, 1)
    with pytest.raises(ValueError, match="shape"):
        StagedWriteTensor((2, 3, 4), torch.int32, "cpu")
    with pytest.raises(ValueError, match="dtype"):
        StagedWriteTensor((2,), torch.bfloat16, "cpu")
    for narrow in (torch.int16, torch.float16, torch.bool):  # the group copies 32-bit words
        with pytest.raises(ValueError, match="4 or 8 bytes"):
            StagedWriteTensor((2, 3), narrow, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("uva", [False, True])
def test_staged_write_tensor_on_cuda(uva: bool) -> None:
    rng = random.Random(4)
    t = StagedWriteTensor((ROWS, COLS), torch.int32, "cuda", uva=uva)
    group = StagedWriteGroup([t])
    assert t.gpu.is_cuda
    expected = [[0] * COLS for _ in range(ROWS)]
    torch.cuda.set_sync_debug_mode("error")  # staging and applying must never wait
    try:
        for _ in range(20):
            writes = random_writes(rng, rng.randint(0, 40))
            for row, start, values in writes:
                t.stage_write(row, start, values)
            apply_one_by_one(expected, writes)
            group.apply_writes()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert t.gpu.tolist() == expected
    # Once sized, the pinned staging buffers are reused, never pinned afresh.
    ring = group.transfer.upload_ring
    held = {i: b.data_ptr() for i, b in enumerate(ring.buffers) if b is not None}
    assert held
    for _ in range(2 * len(ring.buffers)):
        t.stage_write(0, 0, [1])
        group.apply_writes()
    assert {i: ring.buffers[i].data_ptr() for i in held} == held


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("uva", [False, True])
def test_staged_write_tensor_1d_float_on_cuda(uva: bool) -> None:
    rng = random.Random(5)
    t = StagedWriteTensor((33,), torch.float32, "cuda", uva=uva)
    group = StagedWriteGroup([t])
    expected = [0.0] * 33
    for _ in range(10):
        for _ in range(rng.randint(0, 40)):
            row, value = rng.randrange(33), rng.randrange(-64, 64) / 4
            t.stage_write_elem(row, value)
            expected[row] = value
        group.apply_writes()
    assert t.gpu.cpu().tolist() == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uva_view_kernels_see_host_writes_and_host_sees_kernel_writes() -> None:
    from runner.transfer import is_uva_available, make_uva_tensor

    assert is_uva_available()
    table = make_uva_tensor((4, 64), torch.int32)
    assert table.gpu.is_cuda and table.gpu.data_ptr() == table.cpu.data_ptr()
    table.cpu[2, :10] = torch.arange(100, 110, dtype=torch.int32)  # a host write
    input_ids = torch.full((16,), -777, dtype=torch.int32, device="cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    triton_ops(torch.device("cuda")).prepare_prefill_inputs(
        input_ids,
        torch.tensor([2], **i32),
        torch.tensor([0, 10], **i32),
        table.gpu,
        torch.tensor([0, 0, 10, 0], **i32),
        torch.zeros(4, **i32),
        1,
    )
    assert input_ids.cpu().tolist() == list(range(100, 110)) + [-777] * 6
    table.gpu[3].fill_(7)  # a device write into host memory
    torch.cuda.synchronize()
    assert table.cpu[3].tolist() == [7] * 64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_ring_uploads_and_side_copies_arrive_whole() -> None:
    """Uploads of growing, mixed-dtype arrays through the pinned ring, more of
    them than it has buffers, each copied while later ones are staged; and
    side-stream copies into persistent buffers: every device copy equals its
    source."""
    import numpy as np

    from runner.transfer import RING_SIZE, PinnedTransfer

    transfer = PinnedTransfer(torch.device("cuda"))
    rng = np.random.default_rng(0)
    sent, got = [], []
    for i in range(3 * RING_SIZE):
        a = rng.integers(-9, 9, size=(1 + 37 * i,)).astype(np.int32)
        b = rng.standard_normal((i % 5, 3)).astype(np.float32)
        sent.append((a, b))
        got.append(transfer.upload(a, b))
    for (a, b), (da, db) in zip(sent, got):
        assert np.array_equal(da.cpu().numpy(), a) and np.array_equal(db.cpu().numpy(), b)
    dst = torch.zeros((8, 100), dtype=torch.int32, device="cuda")
    rows = torch.zeros(8, dtype=torch.int32, device="cuda")
    for n in (3, 8, 1, 5) * RING_SIZE:
        mask = rng.integers(-2**31, 2**31 - 1, size=(n, 100)).astype(np.int32)
        mask.flags.writeable = False  # as read from a message
        idx = rng.integers(0, 64, size=n).astype(np.int32)
        transfer.copy_into_side([(mask, dst), (idx, rows)])
        seen = (dst[:n].clone(), rows[:n].clone())  # on the main stream, after the copy
        transfer.side_buffers_read()
        assert np.array_equal(seen[0].cpu().numpy(), mask)
        assert np.array_equal(seen[1].cpu().numpy(), idx)
