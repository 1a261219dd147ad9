"""Launch configs per graph size for uniform decode batches of the paged-attention kernel.

A decode batch's grid and tiles are fixed when its CUDA graph is captured,
before any context length is known, so ``choose_num_splits`` and
``tile_config`` pick them from rules of thumb (two programs an SM, 64-key
tiles two stages deep when split). For the head shapes listed here the
table overrides the rules per graph size with the launch chosen by
``python -m benchmarks.bench_attention --tune-decode`` (every split count
and tile at a short and a long context, the least summed time relative to
each context's best), where the decode step confirmed it, or by a sweep of
launches inside the decode step at both contexts where that found a
better one (benchmarks/results/README.md names which); the entries with
``short_keys`` are those where the decode step's A/B found the block-a-tile
path faster at 512 keys, and not slower at 4096 (which it leaves to the
pointer tiles). Shapes and batches not listed keep the rules.
"""

from __future__ import annotations

from typing import NamedTuple


class DecodeLaunch(NamedTuple):
    """A uniform decode batch's launch. ``short_keys``: rows of at most this
    many keys read one cache block a key tile through TMA boxes
    (``triton_unified.block_boxes``), the longer ones ``tile_n`` keys a tile
    through pointers; 0: every row through pointers."""

    num_splits: int
    tile_n: int
    num_warps: int
    num_stages: int
    short_keys: int = 0


# The SM count the entries are for; devices with another keep the rules.
TUNED_NUM_SMS = 132
# (head_dim, query heads per KV head, KV heads, batch rows) -> launch for
# 16-bit caches, or None: the rules. An entry serves the batches above the
# next smaller listed size up to its own (the decode graph sizes).
TUNED_DECODE: dict[tuple[int, int, int, int], DecodeLaunch | None] = {
    # Llama-3.1-8B at TP=1 (32 query heads, 8 KV heads of 128).
    (128, 4, 8, 4): None,
    (128, 4, 8, 8): DecodeLaunch(8, 64, 2, 3, short_keys=1024),
    (128, 4, 8, 16): DecodeLaunch(4, 64, 2, 3, short_keys=1024),
    (128, 4, 8, 24): DecodeLaunch(2, 128, 4, 3),
    (128, 4, 8, 32): DecodeLaunch(2, 64, 2, 3),
    (128, 4, 8, 64): None,
    # Llama-3.2-1B at TP=1 (32 query heads, 8 KV heads of 64).
    (64, 4, 8, 1): DecodeLaunch(32, 64, 2, 3),
    (64, 4, 8, 2): DecodeLaunch(16, 64, 2, 3),
    (64, 4, 8, 4): DecodeLaunch(16, 64, 2, 3),
    (64, 4, 8, 8): DecodeLaunch(8, 64, 2, 3),
    (64, 4, 8, 16): DecodeLaunch(8, 64, 2, 3),
    (64, 4, 8, 24): DecodeLaunch(4, 64, 2, 3),
    (64, 4, 8, 32): DecodeLaunch(2, 64, 2, 3),
    (64, 4, 8, 40): DecodeLaunch(1, 128, 4, 3),
    (64, 4, 8, 48): DecodeLaunch(1, 64, 2, 3),
    (64, 4, 8, 56): DecodeLaunch(1, 128, 4, 2),
    (64, 4, 8, 64): DecodeLaunch(1, 128, 4, 2),
}


def tuned_decode_launch(head_dim: int, nqpk: int, num_kv_heads: int, num_tokens: int,
                        num_sms: int) -> DecodeLaunch | None:
    """The measured launch for a uniform decode batch of ``num_tokens`` rows,
    or None where the rules serve this device, shape and size."""
    if num_sms != TUNED_NUM_SMS:
        return None
    sizes = sorted(rows for (d, g, h, rows) in TUNED_DECODE
                   if (d, g, h) == (head_dim, nqpk, num_kv_heads) and rows >= num_tokens)
    if not sizes:
        return None
    return TUNED_DECODE[(head_dim, nqpk, num_kv_heads, sizes[0])]
