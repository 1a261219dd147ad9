"""The paged KV cache: its dtype, its size per block, its allocation."""

from __future__ import annotations

import math

import torch

from ipc.config import RunnerConfig


def kv_cache_bytes_per_block(model, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers on this rank."""
    shape = model.kv_cache_shape(1, block_size)
    per_layer = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return per_layer * model.config.num_hidden_layers


def allocate_kv_caches(
    model, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """One tensor per layer, shape ``model.kv_cache_shape(num_blocks, block_size)``.

    Unwritten entries are never read: attention reads only positions below
    each request's seq_len, all of which were written first.
    """
    shape = model.kv_cache_shape(num_blocks, block_size)
    return [
        torch.empty(shape, dtype=dtype, device=device)
        for _ in range(model.config.num_hidden_layers)
    ]


def profile_peak_memory(model, config: RunnerConfig, dtype: torch.dtype,
                        device: torch.device) -> int:
    """Peak bytes this process allocates for a full step: the weights plus a
    forward pass of ``max_num_batched_tokens`` tokens over ``max_num_seqs``
    requests and their logits. Attention reads one dummy block; no KV is
    written (slot -1)."""
    from runner.attention.metadata import AttentionMetadata

    num_tokens = config.max_num_batched_tokens
    num_reqs = min(config.max_num_seqs, num_tokens)
    lens = torch.full((num_reqs,), num_tokens // num_reqs, dtype=torch.int32)
    lens[: num_tokens % num_reqs] += 1
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(lens, 0)
    caches = allocate_kv_caches(model, 1, config.block_size, dtype, device)
    attn = AttentionMetadata(
        num_reqs=num_reqs, num_tokens=num_tokens, num_decodes=0,
        max_query_len=int(lens.max()), max_seq_len=int(lens.max()),
        query_start_loc=qsl.to(device), seq_lens=lens.to(device),
        block_tables=torch.zeros(num_reqs, config.max_num_blocks_per_req, dtype=torch.int32,
                                 device=device),
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc_cpu=qsl, seq_lens_cpu=lens,
    )
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        ids = torch.zeros(num_tokens, dtype=torch.int32, device=device)
        positions = torch.zeros(num_tokens, dtype=torch.int64, device=device)
        hidden = model(ids, positions, caches, attn)
        model.compute_logits(hidden[qsl[1:].to(device).long() - 1]).float().softmax(-1)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del caches, hidden
    torch.cuda.empty_cache()
    return peak
