"""Choosing an attention backend by name."""

from __future__ import annotations

import importlib
from typing import Protocol

import torch

from runner.attention.metadata import AttentionMetadata
from runner.ops import device_ops

# name -> (module, class); every backend but the reference is imported lazily.
BACKENDS = {
    "torch": ("runner.attention.torch_ref", "TorchAttentionBackend"),
    "sdpa": ("runner.attention.torch_sdpa", "TorchSDPABackend"),
    "triton": ("runner.attention.triton_attn", "TritonAttentionBackend"),
    "flash_attn": ("runner.attention.flash_attn_backend", "FlashAttentionBackend"),
    # Triton for decodes, torch's FlashAttention for a batch's prefill rows.
    "triton_flash_prefill": ("runner.attention.flash_prefill", "FlashPrefillBackend"),
}


class AttentionBackend(Protocol):
    """Writes k/v at attn.slot_mapping (slot -1 skipped), then causal paged attention.

    q [T, Hq, D], k and v [T, Hkv, D], kv_cache [2, num_blocks, block_size, Hkv, D]
    -> [T, Hq, D]; rows past attn.num_tokens are zeros. With ``sliding_window``
    W, query position q sees keys at positions k with q - W < k <= q.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, attn: AttentionMetadata, scale: float,
                sliding_window: int | None = None) -> torch.Tensor: ...


def attends_to_written_kv(backend: AttentionBackend) -> bool:
    """Whether ``backend`` offers ``attend(q, kv_cache, attn, scale,
    sliding_window, fresh_kv)``: attention over keys and values the model has
    already stored, so the model can fuse the KV write into its rotary kernel
    (and ``wants_fresh_kv(attn, sliding_window)``: whether it would rather
    read a fresh prompt's rotated k and v where they were computed)."""
    return callable(getattr(backend, "attend", None))


def get_attention_backend(name: str | None, device: torch.device) -> AttentionBackend:
    """An instance of backend ``name`` (None: the device's default, "triton"
    on CUDA and "sdpa" elsewhere: ``runner.ops``)."""
    name = name or device_ops(device).attention_backend
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    module_name, class_name = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RuntimeError(
            f"attention backend {name!r} is unavailable: cannot import {module_name} ({e})"
        ) from e
    return getattr(module, class_name)()
