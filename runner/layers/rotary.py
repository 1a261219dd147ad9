"""Rotary position embedding (half-split "neox" layout), with Llama 3 scaling."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ipc.model_config import Llama3RopeScaling
from runner.attention.kv_write import write_kv
from runner.layers.norm_in_matmul import normed_linear_ref
from runner.ops import device_ops


def inverse_frequencies(head_dim: int, theta: float,
                        scaling: Llama3RopeScaling | None) -> torch.Tensor:
    """The head_dim / 2 rotation frequencies, float32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    return inv_freq if scaling is None else llama3_scale(inv_freq, scaling)


def llama3_scale(inv_freq: torch.Tensor, s: Llama3RopeScaling) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by ``factor``, short kept,
    the band between interpolated linearly in ``old_len / wavelength``.
    """
    old_len = s.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    long_wave = wavelength > old_len / s.low_freq_factor
    short_wave = wavelength < old_len / s.high_freq_factor
    smooth = (old_len / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    mid = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    scaled = torch.where(long_wave, inv_freq / s.factor, mid)
    return torch.where(short_wave, inv_freq, scaled)


class RotaryEmbedding(nn.Module):
    """Rotates q and k by their positions: x * cos + rotate_half(x) * sin.

    cos/sin are cached in float32 for positions 0 .. max_positions - 1; the
    rotation runs in float32 and casts back to the input dtype.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: Llama3RopeScaling | None) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.ops = device_ops(self.cos.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; q [T, Hq, D], k [T, Hk, D] -> rotated (q, k).

        One Triton launch on CUDA; the torch code (the oracle) elsewhere."""
        return self.ops.rotary(positions, q, k, self.cos, self.sin)

    def rotate_and_cache(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor, rotate_k_in_place: bool = False) -> torch.Tensor:
        """Rotated q; rotated k and v stored in ``kv_cache`` at ``slot_mapping``
        (slot -1 skipped), and with ``rotate_k_in_place`` k itself rotated. One
        Triton launch (the interpreter on CPU): for the Triton attention
        backend, which then only attends."""
        from runner.layers.triton_rotary import rotary_write_kv_triton  # with that backend only

        return rotary_write_kv_triton(positions, q, k, v, self.cos, self.sin, kv_cache,
                                      slot_mapping, rotate_k_in_place)

    def project_rotate_and_cache(self, positions: torch.Tensor, x: torch.Tensor,
                                 qkv_weight: torch.Tensor, kv_cache: torch.Tensor,
                                 slot_mapping: torch.Tensor, num_q_heads: int,
                                 num_kv_heads: int, parts: torch.Tensor | None = None,
                                 eps: float = 0.0) -> torch.Tensor:
        """``rotate_and_cache`` of the qkv projection of ``x`` (no bias, no
        q/k norm): one launch on CUDA for decode batches, where the projection
        never reaches memory (``qkv_rotary_write_kv_ref`` says what it does;
        with ``parts`` x is the raw residual, ``norm_in_matmul.py``)."""
        return self.ops.qkv_rotary_write_kv(x, qkv_weight, positions, self.cos, self.sin,
                                            kv_cache, slot_mapping, num_q_heads, num_kv_heads,
                                            parts, eps)


def rotary_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_cache: torch.Tensor,
               sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of the rotation, same signature as ``rotary_triton``."""
    cos = cos_cache[positions].unsqueeze(1)
    sin = sin_cache[positions].unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def qkv_rotary_write_kv_ref(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor,
                            cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                            kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                            num_q_heads: int, num_kv_heads: int, parts: torch.Tensor | None = None,
                            eps: float = 0.0) -> torch.Tensor:
    """x [T, K] through the fused qkv weight [(Hq + 2 Hkv) D, K] (q rows, then
    k, then v), rounded to x's dtype; q and k rotated; k and v stored in
    ``kv_cache`` [2, blocks, block_size, Hkv, D] at ``slot_mapping`` as
    ``write_kv`` stores them. Returns the rotated q [T, Hq, D]. With
    ``parts``, x is the raw residual and the projection is
    ``normed_linear_ref``'s (``norm_in_matmul.py``)."""
    projection = (F.linear(x, weight) if parts is None
                  else normed_linear_ref(x, weight, parts, eps))
    heads = projection.unflatten(-1, (-1, kv_cache.shape[-1]))
    q, k, v = heads.split([num_q_heads, num_kv_heads, num_kv_heads], dim=1)
    q, k = rotary_ref(positions, q, k, cos_cache, sin_cache)
    write_kv(k, v, kv_cache, slot_mapping)
    return q


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)
