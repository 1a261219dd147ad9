"""The flash-attn adapter passes the right arguments: checked against a
stand-in ``flash_attn`` module (the real package cannot be installed here)
that computes varlen paged causal attention from exactly those arguments."""

import sys
import types

import pytest
import torch

from runner.attention.metadata import AttentionMetadata
from runner.attention.torch_ref import TorchAttentionBackend


def _standin_varlen(q, k_cache, v_cache, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, causal, block_table, window_size=(-1, -1)):
    # flash-attn's documented window: query i sees keys in [i - left, i + right],
    # -1 meaning unbounded.
    assert causal and q.dim() == 3 and window_size[1] in (-1, 0)
    block = k_cache.shape[1]
    out = torch.empty_like(q)
    for i in range(block_table.shape[0]):
        qs, qe = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        klen = int(cu_seqlens_k[i + 1] - cu_seqlens_k[i])
        assert qe - qs <= max_seqlen_q and klen <= max_seqlen_k
        blocks = block_table[i, : -(-klen // block)].long()
        keys = k_cache[blocks].flatten(0, 1)[:klen]
        values = v_cache[blocks].flatten(0, 1)[:klen]
        group = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q[qs:qe], keys) * softmax_scale
        q_pos = torch.arange(klen - (qe - qs), klen)[:, None]  # bottom-right aligned
        k_pos = torch.arange(klen)[None, :]
        hidden = k_pos > q_pos
        if window_size[0] >= 0:
            hidden |= k_pos < q_pos - window_size[0]
        scores = scores.masked_fill(hidden, float("-inf"))
        out[qs:qe] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
    return out


@pytest.mark.parametrize("window", [None, 7])
def test_adapter_matches_reference(monkeypatch, window):
    monkeypatch.setitem(sys.modules, "flash_attn",
                        types.SimpleNamespace(flash_attn_varlen_func=_standin_varlen))
    from runner.attention.flash_attn_backend import FlashAttentionBackend

    torch.manual_seed(0)
    block, hq, hkv, d = 16, 4, 2, 32
    query_lens, seq_lens = [1, 1, 5, 20], [17, 40, 5, 33]
    qsl = torch.tensor([0, 1, 2, 7, 27], dtype=torch.int32)
    tables = torch.randperm(64).reshape(4, 16).to(torch.int32)
    slots = []
    for i, (ql, sl) in enumerate(zip(query_lens, seq_lens)):
        for p in range(sl - ql, sl):
            slots.append(int(tables[i, p // block]) * block + p % block)
    t = sum(query_lens) + 3  # three padding tokens
    slot_mapping = torch.tensor(slots + [-1] * 3)
    attn = AttentionMetadata(
        num_reqs=4, num_tokens=27, num_decodes=2, max_query_len=20, max_seq_len=40,
        query_start_loc=qsl, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables, slot_mapping=slot_mapping, query_start_loc_cpu=qsl,
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32))
    q, k, v = torch.randn(t, hq, d), torch.randn(t, hkv, d), torch.randn(t, hkv, d)
    cache = torch.randn(2, 64, block, hkv, d)
    want = TorchAttentionBackend().forward(q, k, v, cache.clone(), attn, 0.2, window)
    monkeypatch.setattr("runner.attention.flash_attn_backend.write_kv_cache",
                        _torch_kv_write)
    got = FlashAttentionBackend().forward(q, k, v, cache.clone(), attn, 0.2, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _torch_kv_write(k, v, kv_cache, slot_mapping):
    from runner.attention.kv_write import write_kv

    write_kv(k, v, kv_cache, slot_mapping)
