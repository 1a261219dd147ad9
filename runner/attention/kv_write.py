"""Writing this step's keys and values into the paged KV cache (plain torch)."""

from __future__ import annotations

import torch


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """kv_cache[0|1] viewed as [num_blocks * block_size, Hkv, D]; row ``slot_mapping[t]``
    receives k[t] / v[t]. Tokens with slot -1 (padding) are skipped, and so are
    tokens beyond the end of ``slot_mapping``.
    """
    n = min(k.shape[0], slot_mapping.shape[0])
    slots = slot_mapping[:n]
    keep = slots >= 0
    slots = slots[keep]
    num_slots = kv_cache.shape[1] * kv_cache.shape[2]
    key_cache = kv_cache[0].view(num_slots, *kv_cache.shape[3:])
    value_cache = kv_cache[1].view(num_slots, *kv_cache.shape[3:])
    key_cache[slots] = k[:n][keep].to(kv_cache.dtype)
    value_cache[slots] = v[:n][keep].to(kv_cache.dtype)
