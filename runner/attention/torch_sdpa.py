"""Paged attention with torch's fused SDPA: the CPU default.

Same contract as ``torch_ref.TorchAttentionBackend`` (the oracle its tests
compare against), in a few large calls per layer: one ``index_copy_`` writes
the step's keys and values, all decode rows (the leading ``num_decodes``
rows, one query each) attend in one batched ``scaled_dot_product_attention``
over their keys gathered into a padded batch, and each prompt chunk in one
call of its own. Which cache slots to read and write, and the masks, are
worked out once per step (``StepPlan``) and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runner.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class ChunkPlan:
    """One prompt chunk: query tokens ``start:end``, cache slots of its keys
    (positions 0 .. seq_len - 1) and the mask (None: plain causal)."""

    start: int
    end: int
    slots: torch.Tensor
    mask: torch.Tensor | None


@dataclass(frozen=True)
class StepPlan:
    """What every layer of one step reads and writes.

    ``write_tokens`` (None: all of them) are the tokens with a cache slot;
    ``write_slots`` their slots. ``decode_slots`` [B, S] are the slots of
    each decode row's keys, padded to the longest row with the row's first
    slot (always written, so finite: a never-written slot may hold NaN, and
    a masked NaN still poisons the weighted sum); ``decode_mask`` [B, 1, 1,
    S] hides the padding (and keys outside a sliding window).
    """

    num_write: int
    write_tokens: torch.Tensor | None
    write_slots: torch.Tensor
    decode_slots: torch.Tensor | None
    decode_mask: torch.Tensor | None
    chunks: tuple[ChunkPlan, ...]


class TorchSDPABackend:
    """Causal paged attention with GQA through ``F.scaled_dot_product_attention``.

    Query token j of request i sits at position seq_lens[i] - query_len + j
    and sees its request's keys at positions <= its own (and > its own - W
    with ``sliding_window`` W). Output rows past the real tokens stay 0.
    Reads host copies of the metadata: a CPU backend, not for graph capture.
    """

    def __init__(self) -> None:
        self._attn: AttentionMetadata | None = None
        self._plans: dict[int | None, StepPlan] = {}

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, attn: AttentionMetadata, scale: float,
                sliding_window: int | None = None) -> torch.Tensor:
        plan = self._plan(attn, k.shape[0], kv_cache.shape[2], sliding_window)
        key_cache = kv_cache[0].view(-1, *kv_cache.shape[3:])
        value_cache = kv_cache[1].view(-1, *kv_cache.shape[3:])
        _write(plan, k, v, key_cache, value_cache)
        out = torch.zeros_like(q)
        if plan.decode_slots is not None:
            rows = plan.decode_slots.shape[0]
            out[:rows] = _attend(q[:rows].unsqueeze(1), key_cache, value_cache,
                                 plan.decode_slots, plan.decode_mask, scale)[:, 0]
        for chunk in plan.chunks:
            out[chunk.start:chunk.end] = _attend(
                q[chunk.start:chunk.end].unsqueeze(0), key_cache, value_cache,
                chunk.slots.unsqueeze(0), chunk.mask, scale)[0]
        return out

    def _plan(self, attn: AttentionMetadata, num_tokens: int, block_size: int,
              sliding_window: int | None) -> StepPlan:
        """The step's plan for this window, built by its first layer. The
        step's metadata is held, so its identity marks the step."""
        if self._attn is not attn:
            self._attn, self._plans = attn, {}
        plan = self._plans.get(sliding_window)
        if plan is None:
            plan = build_step_plan(attn, num_tokens, block_size, sliding_window)
            self._plans[sliding_window] = plan
        return plan


def build_step_plan(attn: AttentionMetadata, num_tokens: int, block_size: int,
                    sliding_window: int | None) -> StepPlan:
    n = min(num_tokens, attn.slot_mapping.shape[0])
    slots = attn.slot_mapping[:n]
    keep = slots >= 0
    write_tokens = None if bool(keep.all()) else keep.nonzero().flatten()
    write_slots = slots if write_tokens is None else slots[write_tokens]
    starts = attn.query_start_loc_cpu.tolist()
    seq_lens = attn.seq_lens_cpu.tolist()
    decode_slots = decode_mask = None
    if attn.num_decodes:
        decode_slots, decode_mask = _decode_plan(attn, block_size, sliding_window)
    chunks = []
    for i in range(attn.num_decodes, attn.num_reqs):
        start, end = starts[i], starts[i + 1]
        if end > start:
            chunk_slots = _slots(attn.block_tables[i:i + 1], seq_lens[i], block_size)[0]
            mask = _chunk_mask(end - start, seq_lens[i], sliding_window, attn.slot_mapping.device)
            chunks.append(ChunkPlan(start, end, chunk_slots, mask))
    return StepPlan(n, write_tokens, write_slots, decode_slots, decode_mask, tuple(chunks))


def _slots(block_rows: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """Cache slots of positions 0 .. length - 1 for each row of ``block_rows`` -> [R, length]."""
    pos = torch.arange(length, device=block_rows.device)
    blocks = block_rows[:, pos // block_size].long()
    return blocks * block_size + pos % block_size


def _decode_plan(attn: AttentionMetadata, block_size: int,
                 sliding_window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    rows = attn.num_decodes
    longest = int(attn.seq_lens_cpu[:rows].max())
    slots = _slots(attn.block_tables[:rows], longest, block_size)
    seq_lens = attn.seq_lens[:rows].unsqueeze(1)
    k_pos = torch.arange(longest, device=slots.device).unsqueeze(0)
    visible = k_pos < seq_lens
    if sliding_window is not None:
        visible &= k_pos >= seq_lens - sliding_window
    slots = torch.where(visible, slots, slots[:, :1])
    return slots, visible[:, None, None, :]


def _chunk_mask(num_queries: int, seq_len: int, sliding_window: int | None,
                device: torch.device) -> torch.Tensor | None:
    """[n, S] bool: query j (position seq_len - n + j) sees key k; None when
    that is SDPA's own causal mask (no cached prefix, no window)."""
    if num_queries == seq_len and sliding_window is None:
        return None
    q_pos = torch.arange(seq_len - num_queries, seq_len, device=device).unsqueeze(1)
    k_pos = torch.arange(seq_len, device=device).unsqueeze(0)
    visible = k_pos <= q_pos
    if sliding_window is not None:
        visible &= k_pos > q_pos - sliding_window
    return visible


def _write(plan: StepPlan, k: torch.Tensor, v: torch.Tensor, key_cache: torch.Tensor,
           value_cache: torch.Tensor) -> None:
    """Store the step's keys and values at their slots (flat caches [slots, Hkv, D])."""
    k, v = k[:plan.num_write], v[:plan.num_write]
    if plan.write_tokens is not None:
        k, v = k[plan.write_tokens], v[plan.write_tokens]
    key_cache.index_copy_(0, plan.write_slots, k.to(key_cache.dtype))
    value_cache.index_copy_(0, plan.write_slots, v.to(value_cache.dtype))


def _attend(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
            slots: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """q [R, n, Hq, D] over the keys at ``slots`` [R, S] -> [R, n, Hq, D]."""
    rows, length = slots.shape
    flat = slots.flatten()
    keys = key_cache.index_select(0, flat).view(rows, length, *key_cache.shape[1:])
    values = value_cache.index_select(0, flat).view(rows, length, *value_cache.shape[1:])
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys.transpose(1, 2).to(q.dtype), values.transpose(1, 2).to(q.dtype),
        attn_mask=mask, is_causal=mask is None and q.shape[1] > 1, scale=scale,
        enable_gqa=True)
    return out.transpose(1, 2)
