"""Paged attention with torch's fused SDPA: the CPU default.

Same contract as ``torch_ref.TorchAttentionBackend`` (the oracle its tests
compare against), in fewer and larger calls: all decode rows (the leading
``num_decodes`` rows, one query each) in one batched
``scaled_dot_product_attention`` over their keys gathered into a padded
batch, and each prompt chunk in one call of its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.attention.kv_write import write_kv
from runner.attention.metadata import AttentionMetadata


class TorchSDPABackend:
    """Causal paged attention with GQA through ``F.scaled_dot_product_attention``.

    Query token j of request i sits at position seq_lens[i] - query_len + j
    and sees its request's keys at positions <= its own (and > its own - W
    with ``sliding_window`` W). Output rows past the real tokens stay 0.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, attn: AttentionMetadata, scale: float,
                sliding_window: int | None = None) -> torch.Tensor:
        write_kv(k, v, kv_cache, attn.slot_mapping)
        out = torch.zeros_like(q)
        decodes = attn.num_decodes
        if decodes:
            out[:decodes] = _decode(q[:decodes], kv_cache, attn, scale, sliding_window)
        starts = attn.query_start_loc_cpu.tolist()
        seq_lens = attn.seq_lens_cpu.tolist()
        for i in range(decodes, attn.num_reqs):
            start, end = starts[i], starts[i + 1]
            if end > start:
                out[start:end] = _prefill(q[start:end], kv_cache, attn.block_tables[i],
                                          seq_lens[i], scale, sliding_window)
        return out


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """Positions 0 .. length - 1 of one cache half for each row of ``blocks``
    [R, n] -> [R, Hkv, length, D] (SDPA's head-major layout)."""
    return cache[blocks].flatten(1, 2)[:, :length].transpose(1, 2)


def _decode(q: torch.Tensor, kv_cache: torch.Tensor, attn: AttentionMetadata, scale: float,
            sliding_window: int | None) -> torch.Tensor:
    """One query per row, rows padded to the longest: q [B, Hq, D] -> [B, Hq, D].

    Keys past a row's seq_len are masked out, and their gathered copies
    zeroed: a cache slot never written may hold NaN, and 0 * NaN is NaN.
    """
    rows = q.shape[0]
    seq_lens_cpu = attn.seq_lens_cpu[:rows]
    longest = int(seq_lens_cpu.max())
    block_size = kv_cache.shape[2]
    blocks = attn.block_tables[:rows, : -(-longest // block_size)].long()
    keys = _gather(kv_cache[0], blocks, longest)
    values = _gather(kv_cache[1], blocks, longest)
    seq_lens = attn.seq_lens[:rows].unsqueeze(1)
    k_pos = torch.arange(longest, device=q.device).unsqueeze(0)
    visible = k_pos < seq_lens
    if sliding_window is not None:
        visible &= k_pos >= seq_lens - sliding_window
    if int(seq_lens_cpu.min()) < longest or sliding_window is not None:
        hidden = ~visible[:, None, :, None]
        keys = keys.masked_fill(hidden, 0.0)
        values = values.masked_fill(hidden, 0.0)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), keys.to(q.dtype), values.to(q.dtype),
        attn_mask=visible[:, None, None, :], scale=scale, enable_gqa=True)
    return out.squeeze(2)


def _prefill(q: torch.Tensor, kv_cache: torch.Tensor, block_row: torch.Tensor, seq_len: int,
             scale: float, sliding_window: int | None) -> torch.Tensor:
    """q [n, Hq, D] for the last n of seq_len positions -> [n, Hq, D]."""
    n = q.shape[0]
    block_size = kv_cache.shape[2]
    blocks = block_row[: -(-seq_len // block_size)].long().unsqueeze(0)
    keys = _gather(kv_cache[0], blocks, seq_len).to(q.dtype)
    values = _gather(kv_cache[1], blocks, seq_len).to(q.dtype)
    query = q.transpose(0, 1).unsqueeze(0)
    if n == seq_len and sliding_window is None:
        out = F.scaled_dot_product_attention(query, keys, values, is_causal=True, scale=scale,
                                             enable_gqa=True)
    else:
        q_pos = torch.arange(seq_len - n, seq_len, device=q.device).unsqueeze(1)
        k_pos = torch.arange(seq_len, device=q.device).unsqueeze(0)
        visible = k_pos <= q_pos
        if sliding_window is not None:
            visible &= k_pos > q_pos - sliding_window
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=visible,
                                             scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)
