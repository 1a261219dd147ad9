"""Padded rows as a CUDA graph runs them: rows past the batch map to the
padding slot and own no token. Both the Triton kernels (interpreter on CPU)
and the torch references must leave the real rows' inputs intact."""

import pytest
import torch

from runner.ops import torch_ops, triton_ops
from tests.helpers.kernel_device import KERNEL_DEVICE

PAD = 8  # the padding slot: lengths 0, block-table row 0
TRITON_DEVICE = KERNEL_DEVICE


def _state():
    prefill_len = torch.zeros(9, dtype=torch.int32)
    computed = torch.zeros(9, dtype=torch.int32)
    prefill_len[[3, 5, 1]] = torch.tensor([40, 17, 6], dtype=torch.int32)
    computed[[3, 5, 1]] = torch.tensor([40, 17, 6], dtype=torch.int32)  # all three decode
    all_tokens = torch.arange(9 * 64, dtype=torch.int32).reshape(9, 64)
    last = torch.tensor([100 + i for i in range(9)], dtype=torch.int64)
    table = torch.zeros(9, 8, dtype=torch.int32)
    table[3, :3], table[5, :2], table[1, 0] = torch.tensor([5, 9, 13]), torch.tensor([2, 4]), 21
    return prefill_len, computed, all_tokens, last, table


@pytest.mark.parametrize("variant", ["ref", "triton"])
def test_zero_token_padded_rows_do_not_touch_real_rows(variant):
    device = TRITON_DEVICE if variant == "triton" else "cpu"
    ops = triton_ops(TRITON_DEVICE) if variant == "triton" else torch_ops(torch.device("cpu"))
    prefill_len, computed, all_tokens, last, table = (t.to(device) for t in _state())
    size = 5  # 3 real rows, 2 padded
    idx = torch.tensor([3, 5, 1, PAD, PAD], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 1, 2, 3, 3, 3], dtype=torch.int32, device=device)
    input_ids = torch.full((8,), -777, dtype=torch.int32, device=device)
    positions = torch.full((8,), 0, dtype=torch.int64, device=device)
    seq_lens = torch.full((6,), -777, dtype=torch.int32, device=device)
    logits = torch.full((8,), -777, dtype=torch.int64, device=device)
    slots = torch.full((8,), -777, dtype=torch.int64, device=device)
    ops.prepare_prefill_inputs(
        input_ids, idx, qsl, all_tokens, prefill_len, computed, size)
    ops.prepare_pos_seq_lens(idx, qsl, computed, positions, seq_lens, size)
    ops.combine_sampled_tokens(input_ids, idx, last, qsl, seq_lens, prefill_len, logits, size)
    ops.compute_slot_mappings(
        table, idx, qsl, positions, 16, slots, size, size, size)
    # The padded rows end where row 2 ends: they must not clobber its token.
    assert input_ids[:3].tolist() == [103, 105, 101]
    assert positions[:3].tolist() == [40, 17, 6]
    assert seq_lens.tolist() == [41, 18, 7, 0, 0, 0]
    assert logits[:3].tolist() == [0, 1, 2]
    # Tokens 3 and 4 belong to no row (the device's query_start_loc ends at
    # 3): slot -1, with no fill before; tokens past the padded count untouched.
    assert slots.tolist() == [13 * 16 + 8, 4 * 16 + 1, 21 * 16 + 6, -1, -1, -777, -777, -777]
