"""Reference paged attention in plain torch: the CPU path and the test oracle.

It loops over requests on the host; keep it obviously right, not fast.
"""

from __future__ import annotations

import torch

from runner.attention.kv_write import write_kv
from runner.attention.metadata import AttentionMetadata


class TorchAttentionBackend:
    """Causal paged attention with GQA, one request at a time, in float32.

    Query token j of request i (tokens query_start_loc[i] .. [i+1]) sits at
    position seq_lens[i] - query_len + j and attends to its request's cached
    keys at positions <= its own. Position p lives in block
    block_tables[i, p // block_size] at offset p % block_size. Query head h
    reads kv head h // (Hq // Hkv). Output rows past the real tokens stay 0.
    With ``sliding_window`` W it sees only keys at positions > its own - W.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, attn: AttentionMetadata, scale: float,
                sliding_window: int | None = None) -> torch.Tensor:
        write_kv(k, v, kv_cache, attn.slot_mapping)
        out = torch.zeros_like(q)
        starts = attn.query_start_loc_cpu.tolist()
        seq_lens = attn.seq_lens_cpu.tolist()
        for i in range(attn.num_reqs):
            start, end = starts[i], starts[i + 1]
            if end > start:
                keys, values = _gather_request_kv(kv_cache, attn.block_tables[i], seq_lens[i])
                out[start:end] = _attend(q[start:end], keys, values, scale, sliding_window)
        return out


def _gather_request_kv(kv_cache: torch.Tensor, block_row: torch.Tensor,
                       seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of positions 0 .. seq_len - 1, each [seq_len, Hkv, D]."""
    block_size = kv_cache.shape[2]
    num_blocks = -(-seq_len // block_size)
    blocks = block_row[:num_blocks].long()
    keys = kv_cache[0, blocks].flatten(0, 1)[:seq_len]
    values = kv_cache[1, blocks].flatten(0, 1)[:seq_len]
    return keys, values


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
            scale: float, sliding_window: int | None) -> torch.Tensor:
    """q [n, Hq, D] for the last n positions of keys/values [S, Hkv, D] -> [n, Hq, D]."""
    n, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    keys = keys.float().repeat_interleave(group, dim=1)
    values = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * scale
    q_pos = torch.arange(seq_len - n, seq_len, device=q.device).unsqueeze(1)
    k_pos = torch.arange(seq_len, device=q.device).unsqueeze(0)
    hidden = k_pos > q_pos
    if sliding_window is not None:
        hidden |= k_pos <= q_pos - sliding_window
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
