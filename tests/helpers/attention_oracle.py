"""Paged attention batches and their plain-torch dense oracle, shared by the
attention backend tests.

The oracle is independent of the kernels: it writes the expected cache with
torch indexing, gathers each request's keys and values through its block
table, and runs causal softmax attention in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from runner.attention.metadata import AttentionMetadata
from runner.attention.triton_attn import TritonAttentionBackend
from tests.helpers.kernel_device import KERNEL_DEVICE

DEVICE = KERNEL_DEVICE


@dataclass
class Batch:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_cache: torch.Tensor
    attn: AttentionMetadata
    query_lens: list[int]
    seq_lens: list[int]


def make_batch(
    seed: int,
    query_lens: list[int],
    seq_lens: list[int],
    *,
    num_pad_tokens: int = 0,
    block_size: int = 16,
    head_dim: int = 64,
    num_q_heads: int = 4,
    num_kv_heads: int = 1,
    dtype: torch.dtype = torch.float32,
    fused_qkv: bool = False,
) -> Batch:
    """A batch in runner order; rows with query_len 0 are padding rows.

    Blocks come from a shuffled pool; unused block-table entries point at random
    real blocks, and the cache starts filled with noise, so reading a key the
    row does not own changes the result instead of going unnoticed.
    """
    gen = torch.Generator().manual_seed(seed)
    num_reqs = len(query_lens)
    blocks_per_req = [math.ceil(s / block_size) for s in seq_lens]
    width = max(blocks_per_req) + 2
    num_blocks = sum(blocks_per_req) + 3
    pool = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.randint(0, num_blocks, (num_reqs, width), generator=gen)
    used = 0
    for i, n in enumerate(blocks_per_req):
        block_tables[i, :n] = pool[used : used + n]
        used += n

    slots = []
    for i, (q_len, s_len) in enumerate(zip(query_lens, seq_lens)):
        for pos in range(s_len - q_len, s_len):
            slots.append(int(block_tables[i, pos // block_size]) * block_size + pos % block_size)
    num_tokens = len(slots)
    total = num_tokens + num_pad_tokens
    slots += [-1] * num_pad_tokens

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    if fused_qkv:
        qkv = rand(total, (num_q_heads + 2 * num_kv_heads) * head_dim).to(DEVICE)
        kv_width = num_kv_heads * head_dim
        q, k, v = qkv.split([num_q_heads * head_dim, kv_width, kv_width], dim=1)
        q = q.view(total, num_q_heads, head_dim)
        k = k.view(total, num_kv_heads, head_dim)
        v = v.view(total, num_kv_heads, head_dim)
    else:
        q = rand(total, num_q_heads, head_dim)
        k = rand(total, num_kv_heads, head_dim)
        v = rand(total, num_kv_heads, head_dim)
    kv_cache = rand(2, num_blocks, block_size, num_kv_heads, head_dim)

    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    query_start_loc = torch.tensor(starts, dtype=torch.int32)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    attn = AttentionMetadata(
        num_reqs=num_reqs,
        num_tokens=num_tokens,
        num_decodes=sum(1 for q_len in query_lens if q_len == 1),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_start_loc=query_start_loc.to(DEVICE),
        seq_lens=seq_lens_t.to(DEVICE),
        block_tables=block_tables.to(torch.int32).to(DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens_t,
    )
    on = {"device": DEVICE}
    return Batch(q.to(**on), k.to(**on), v.to(**on), kv_cache.to(**on), attn,
                 list(query_lens), list(seq_lens))


def expected_cache(batch: Batch) -> torch.Tensor:
    """The cache after the write, by torch indexing over the flat slot axis."""
    cache = batch.kv_cache.clone()
    slots = batch.attn.slot_mapping
    keep = slots >= 0
    num_kv_heads, head_dim = cache.shape[3], cache.shape[4]
    flat = cache.view(2, -1, num_kv_heads, head_dim)
    flat[0, slots[keep]] = batch.k[keep]
    flat[1, slots[keep]] = batch.v[keep]
    return cache


def dense_reference(batch: Batch, cache: torch.Tensor, scale: float,
                    window: int | None = None) -> torch.Tensor:
    """Causal softmax attention per request in float32; padding tokens give zeros.
    With ``window`` W, position q also hides keys at positions <= q - W."""
    q = batch.q.float()
    out = torch.zeros_like(q)
    group = q.shape[1] // cache.shape[3]
    block_size = cache.shape[2]
    tables = batch.attn.block_tables.long()
    start = 0
    for i, (q_len, s_len) in enumerate(zip(batch.query_lens, batch.seq_lens)):
        if q_len == 0 or s_len == 0:
            start += q_len
            continue
        pos = torch.arange(s_len, device=q.device)
        blocks = tables[i, pos // block_size]
        keys = cache[0, blocks, pos % block_size].float().repeat_interleave(group, dim=1)
        values = cache[1, blocks, pos % block_size].float().repeat_interleave(group, dim=1)
        query = q[start : start + q_len]
        logits = torch.einsum("thd,khd->htk", query, keys) * scale
        q_pos = torch.arange(s_len - q_len, s_len, device=q.device)
        hidden = pos[None, None, :] > q_pos[None, :, None]
        if window is not None:
            hidden = hidden | (pos[None, None, :] <= q_pos[None, :, None] - window)
        logits = logits.masked_fill(hidden, float("-inf"))
        out[start : start + q_len] = torch.einsum("htk,khd->thd", logits.softmax(-1), values)
        start += q_len
    return out


def run_and_check(batch: Batch, backend: TritonAttentionBackend, atol: float, rtol: float = 0,
                  window: int | None = None):
    scale = batch.q.shape[-1] ** -0.5
    want_cache = expected_cache(batch)
    want = dense_reference(batch, want_cache, scale, window)
    out = backend.forward(batch.q, batch.k, batch.v, batch.kv_cache, batch.attn, scale,
                          sliding_window=window)
    assert out.shape == batch.q.shape and out.dtype == batch.q.dtype
    assert torch.isfinite(out).all()
    assert torch.equal(batch.kv_cache, want_cache)
    torch.testing.assert_close(out.float(), want, atol=atol, rtol=rtol)
    return out


# A mixed batch in runner order: decodes, a short extend with a cached prefix,
# a chunked prefill with a prefix crossing blocks, a fresh prompt, then padding.
# Seq len 63 puts a query one key before a 64-key tile boundary.
MIXED_QUERY_LENS = [1, 1, 1, 1, 3, 11, 20, 0]
MIXED_SEQ_LENS = [5, 33, 63, 70, 40, 50, 20, 0]
