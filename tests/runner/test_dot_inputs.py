"""The one input predicate of the skinny and medium Triton matmuls."""

import torch

from runner.layers.dot_inputs import dot_inputs
from runner.layers.triton_medium_matmul import MEDIUM_MAX_ROWS, MEDIUM_MIN_ROWS, medium_inputs
from runner.layers.triton_skinny_matmul import SKINNY_MAX_ROWS, skinny_inputs


def test_dtype_rows_and_strides():
    w = torch.zeros(32, 64, dtype=torch.bfloat16)
    assert dot_inputs(torch.zeros(4, 64, dtype=torch.bfloat16), w, 1, 16)
    assert dot_inputs(torch.zeros(4, 64, dtype=torch.float16), w, 1, 16)
    assert not dot_inputs(torch.zeros(4, 64), w, 1, 16)  # float32: no half tiles
    assert not dot_inputs(torch.zeros(17, 64, dtype=torch.bfloat16), w, 1, 16)
    assert not dot_inputs(torch.zeros(16, 64, dtype=torch.bfloat16), w, 17, 64)
    strided = torch.zeros(4, 128, dtype=torch.bfloat16)[:, ::2]
    assert not dot_inputs(strided, w, 1, 16)
    assert not dot_inputs(torch.zeros(4, 64, dtype=torch.bfloat16), w.t().contiguous().t(), 1, 16)


def test_families_split_the_rows_without_gap_or_overlap():
    w = torch.zeros(32, 64, dtype=torch.bfloat16)
    for rows in range(1, MEDIUM_MAX_ROWS + 2):
        x = torch.zeros(rows, 64, dtype=torch.bfloat16)
        takers = skinny_inputs(x, w) + medium_inputs(x, w)
        assert takers == (1 if rows <= MEDIUM_MAX_ROWS else 0), rows
    assert SKINNY_MAX_ROWS + 1 == MEDIUM_MIN_ROWS
