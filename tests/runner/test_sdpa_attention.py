"""The SDPA attention backend (the CPU default) against the plain-torch reference.

Batches in runner order (decodes first, then prompt chunks, some with a
cached prefix), GQA, sliding windows, and cache slots never written that
hold NaN: the reference reads only written keys, and so must the backend.
"""

from __future__ import annotations

import pytest
import torch

from runner.attention.torch_ref import TorchAttentionBackend
from runner.attention.torch_sdpa import TorchSDPABackend
from tests.helpers.attention_oracle import make_batch

CASES = [
    # (query_lens, seq_lens): decode rows lead, as the runner orders them
    ([1, 1, 1], [5, 33, 17]),
    ([1, 1, 7, 20], [1, 40, 7, 45]),
    ([9], [9]),
    ([4, 30], [50, 30]),
    ([1, 1, 1, 1, 1, 1, 1, 1], [16, 17, 3, 64, 65, 2, 31, 100]),
]


def _poison_unwritten(batch) -> None:
    """NaN in every slot of the rows' blocks at positions >= seq_len."""
    block_size = batch.kv_cache.shape[2]
    for i, seq_len in enumerate(batch.seq_lens):
        table = batch.attn.block_tables[i]
        last = table[(seq_len - 1) // block_size]
        batch.kv_cache[:, last, seq_len % block_size or block_size:] = float("nan")


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("heads", [(4, 1), (6, 2), (3, 3)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_sdpa_matches_reference(case, heads, window):
    query_lens, seq_lens = CASES[case]
    batch = make_batch(case, query_lens, seq_lens, num_pad_tokens=3, num_q_heads=heads[0],
                       num_kv_heads=heads[1], head_dim=32, dtype=torch.float32)
    _poison_unwritten(batch)
    scale = 32 ** -0.5
    ref_cache = batch.kv_cache.clone()
    want = TorchAttentionBackend().forward(batch.q, batch.k, batch.v, ref_cache, batch.attn,
                                           scale, sliding_window=window)
    got = TorchSDPABackend().forward(batch.q, batch.k, batch.v, batch.kv_cache, batch.attn,
                                     scale, sliding_window=window)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(batch.kv_cache, ref_cache, equal_nan=True)


def test_sdpa_bfloat16_close_to_reference():
    batch = make_batch(7, [1, 1, 12], [20, 3, 40], num_q_heads=4, num_kv_heads=2,
                       head_dim=32, dtype=torch.bfloat16)
    ref_cache = batch.kv_cache.clone()
    want = TorchAttentionBackend().forward(batch.q, batch.k, batch.v, ref_cache, batch.attn,
                                           0.2)
    got = TorchSDPABackend().forward(batch.q, batch.k, batch.v, batch.kv_cache, batch.attn, 0.2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


def test_layers_of_one_step_share_its_plan_and_a_new_step_gets_its_own():
    backend, reference = TorchSDPABackend(), TorchAttentionBackend()
    first = make_batch(11, [1, 1, 5], [9, 20, 5], num_q_heads=4, num_kv_heads=2, head_dim=32)
    second = make_batch(12, [1, 3], [30, 3], num_q_heads=4, num_kv_heads=2, head_dim=32)
    for batch in (first, first, second):  # two layers of one step, then the next step
        layer_cache = batch.kv_cache.clone()
        ref_cache = batch.kv_cache.clone()
        want = reference.forward(batch.q, batch.k, batch.v, ref_cache, batch.attn, 0.25)
        got = backend.forward(batch.q, batch.k, batch.v, layer_cache, batch.attn, 0.25)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(layer_cache, ref_cache)
