"""flash-attn as an optional attention backend (``--attention-backend flash_attn``).

Used only when asked for and the ``flash_attn`` package imports. The
adapter is tested against a stand-in module that computes the same function
from the same arguments, not against the real package. flash-attn 2 needs a
KV block size that is a multiple of 256 for a paged cache; the Triton
backend has no such limit and is the GPU default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.attention.metadata import AttentionMetadata
from runner.attention.triton_kv_write import write_kv_cache


class FlashAttentionBackend:
    """``flash_attn_varlen_func`` over the paged cache through ``block_table``.

    Causal masks in flash-attn align to the bottom right when a request has
    fewer queries than keys, which is this project's convention: query j of
    a row sits at position seq_len - query_len + j.
    """

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func

        self.varlen = flash_attn_varlen_func

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, attn: AttentionMetadata, scale: float,
                sliding_window: int | None = None) -> torch.Tensor:
        write_kv_cache(k, v, kv_cache, attn.slot_mapping)
        out = torch.zeros_like(q)
        n, t = attn.num_reqs, attn.num_tokens
        if n == 0 or t == 0:
            return out
        seq_lens = attn.seq_lens[:n]
        cu_seqlens_k = F.pad(torch.cumsum(seq_lens, 0, dtype=torch.int32), (1, 0))
        out[:t] = self.varlen(
            q[:t], kv_cache[0], kv_cache[1],
            cu_seqlens_q=attn.query_start_loc[: n + 1], cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=attn.max_query_len, max_seqlen_k=attn.max_seq_len,
            softmax_scale=scale, causal=True, block_table=attn.block_tables[:n],
            # flash-attn's window (left, right) counts keys beside the query's own.
            window_size=(-1, -1) if sliding_window is None else (sliding_window - 1, 0),
        )
        return out
