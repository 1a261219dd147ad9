"""Prefill attention through torch's FlashAttention, the Triton backend otherwise.

The runner orders a batch decodes first, then extends and prefills by token
count, so the rows with more than one query token form a suffix. On CUDA
that suffix goes to ``torch.nn.attention.varlen.varlen_attn``
(FlashAttention inside torch) in one launch, or, where that module is
missing, to ``scaled_dot_product_attention`` once per row; the decode rows
before it take the Triton kernels as a batch of their own. Decode batches
(CUDA-graph capture among them) and sliding windows take the Triton
kernels unchanged.

The flash kernels read contiguous K/V, not the paged cache (torch's paged
variant wants pages of 256 tokens or more), so each suffix row's keys and
values, cached prefix included, are gathered from the cache through its
block table first: a copy of seq_len x Hkv x D per tensor, small beside the
attention of its queries over those keys. Causal masks align bottom-right:
query j of a row sits at position seq_len - query_len + j.

Host synchronisation: none. The choice and every size read the host copies
of the metadata (``query_start_loc_cpu``, ``seq_lens_cpu``); the gather
indices are built on the device.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from runner.attention.metadata import AttentionMetadata, leading_rows
from runner.attention.triton_attn import MAX_SPLITS, TritonAttentionBackend
from runner.ops import device_ops

PREFILL_KERNELS = ("varlen", "sdpa", "triton")


class VarlenAttn(NamedTuple):
    """torch's ``varlen_attn`` and how this torch's signature spells our call."""

    fn: Callable
    causal: dict  # the keyword arguments that make it causal
    takes_scale: bool
    takes_gqa: bool  # ``enable_gqa``; without it K/V are expanded per query head


@functools.cache
def varlen_attn_function() -> VarlenAttn | None:
    """torch's ``varlen_attn``, or None where this torch lacks it. Older
    signatures take ``is_causal``; newer ones a ``window_size`` pair, (-1, 0)
    being causal, and ``enable_gqa`` for fewer K/V heads than query heads."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        causal = {"is_causal": True}
    elif "window_size" in params:
        causal = {"window_size": (-1, 0)}
    else:
        return None
    return VarlenAttn(varlen_attn, causal, "scale" in params, "enable_gqa" in params)


def default_prefill_kernel(device: torch.device) -> str:
    """"varlen" where torch's fused kernels run (``DeviceOps.flash_kernels``)
    and this torch has it, else "sdpa" there, "triton" elsewhere (on CPU the
    Triton kernels run under the interpreter, as the backend's do)."""
    if not device_ops(device).flash_kernels:
        return "triton"
    return "varlen" if varlen_attn_function() is not None else "sdpa"


def prefill_suffix_start(attn: AttentionMetadata, sliding_window: int | None) -> int | None:
    """First row of the batch's trailing rows that are not decodes (more than
    one query token, or none: padding), when one of them has more than one
    query token; else None. Rows with drafts are decodes (they lead the
    batch; their host seq_lens may be upper bounds). Host ints only."""
    n = attn.num_reqs
    if n == 0 or sliding_window is not None or attn.max_query_len <= 1:
        return None
    starts = attn.query_start_loc_cpu[: n + 1]
    query_lens = (starts[1:] - starts[:-1]).tolist()
    first = n
    while first > attn.num_draft_rows and query_lens[first - 1] != 1:
        first -= 1
    return first if max(query_lens[first:], default=0) > 1 else None


def gather_rows_kv(kv_cache: torch.Tensor, attn: AttentionMetadata,
                   first: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and values of positions 0 .. seq_len - 1 of rows ``first`` .. the
    last, packed row after row ([sum of seq_lens, Hkv, D] each), and their
    offsets cu_seq_k [rows + 1] (int32, on the device)."""
    n, block_size = attn.num_reqs, kv_cache.shape[2]
    seq_lens = attn.seq_lens[first:n]
    total = int(attn.seq_lens_cpu[first:n].sum())
    cu_seq_k = F.pad(torch.cumsum(seq_lens, 0, dtype=torch.int32), (1, 0))
    device = kv_cache.device
    rows = torch.repeat_interleave(torch.arange(n - first, device=device), seq_lens,
                                   output_size=total)
    positions = torch.arange(total, device=device) - cu_seq_k[rows]
    blocks = attn.block_tables[first:n][rows, positions // block_size].long()
    slots = blocks * block_size + positions % block_size
    flat = kv_cache.flatten(1, 2)  # [2, blocks * block_size, Hkv, D]
    return flat[0].index_select(0, slots), flat[1].index_select(0, slots), cu_seq_k


def sdpa_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_starts: list[int],
                 key_starts: list[int], scale: float, out: torch.Tensor) -> None:
    """Causal attention of each row's queries over its keys (bottom-right
    aligned), one SDPA call per row (K/V heads shared by query groups through
    ``enable_gqa``)."""
    rows = zip(query_starts, query_starts[1:], key_starts, key_starts[1:])
    for q_start, q_end, k_start, k_end in rows:
        q_len, k_len = q_end - q_start, k_end - k_start
        if q_len == 0:
            continue
        qi = q[q_start:q_end].transpose(0, 1).unsqueeze(0)
        ki, vi = (x[k_start:k_end].transpose(0, 1).unsqueeze(0) for x in (k, v))
        mask = None
        if q_len != k_len:
            mask = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device)
            mask = mask.tril(diagonal=k_len - q_len)
        oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, is_causal=mask is None,
                                            scale=scale, enable_gqa=True)
        out[q_start:q_end] = oi[0].transpose(0, 1)


class FlashPrefillBackend(TritonAttentionBackend):
    """The Triton backend with a batch's prefill rows sent to torch's flash kernels.

    prefill_kernel: "varlen", "sdpa" or "triton" (never leave the Triton
    kernels); None picks ``default_prefill_kernel`` for the query's device.
    """

    # The prefill rows' kernel and sizes are read from host copies each step.
    captures_mixed_batches = False

    def __init__(self, num_splits: int | None = None, max_splits: int = MAX_SPLITS,
                 prefill_kernel: str | None = None) -> None:
        super().__init__(num_splits, max_splits)
        if prefill_kernel is not None and prefill_kernel not in PREFILL_KERNELS:
            raise ValueError(f"prefill_kernel must be one of {PREFILL_KERNELS}, "
                             f"got {prefill_kernel!r}")
        if prefill_kernel == "varlen" and varlen_attn_function() is None:
            raise RuntimeError("torch.nn.attention.varlen.varlen_attn is not in this torch")
        self.prefill_kernel = prefill_kernel

    def wants_fresh_kv(self, attn: AttentionMetadata, sliding_window: int | None) -> bool:
        return False  # its prefill rows read the cache, fresh or not

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, attn: AttentionMetadata,
               scale: float, sliding_window: int | None = None,
               fresh_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        kernel, first = self.kernel_for(q, attn, scale, sliding_window)
        if kernel == "triton":
            return super().attend(q, kv_cache, attn, scale, sliding_window)
        n = attn.num_reqs
        starts = attn.query_start_loc_cpu[: n + 1]
        begin, end = int(starts[first]), attn.num_tokens
        out = torch.empty_like(q)
        out[end:].zero_()
        if first > 0:
            out[:begin] = super().attend(q[:begin], kv_cache, leading_rows(attn, first), scale,
                                         sliding_window)
        k, v, cu_seq_k = gather_rows_kv(kv_cache, attn, first)
        if kernel == "sdpa":
            key_starts = F.pad(attn.seq_lens_cpu[first:n].cumsum(0), (1, 0)).tolist()
            sdpa_prefill(q[begin:end], k, v, (starts[first:] - begin).tolist(), key_starts,
                         scale, out[begin:end])
            return out
        cu_seq_q = attn.query_start_loc[first: n + 1] - begin
        max_q = int((starts[first + 1:] - starts[first:-1]).max())
        max_k = int(attn.seq_lens_cpu[first:n].max())
        out[begin:end] = run_varlen(varlen_attn_function(), q[begin:end].contiguous(), k, v,
                                    (cu_seq_q, cu_seq_k), (max_q, max_k), scale)
        return out

    def kernel_for(self, q: torch.Tensor, attn: AttentionMetadata, scale: float,
                   sliding_window: int | None) -> tuple[str, int]:
        """The kernel for the batch's trailing prefill rows ("varlen", "sdpa"
        or, for the whole batch, "triton") and the first of those rows."""
        kernel = self.prefill_kernel or default_prefill_kernel(q.device)
        first = prefill_suffix_start(attn, sliding_window)
        if kernel == "triton" or first is None:
            return "triton", attn.num_reqs
        if kernel == "varlen" and q.dtype not in (torch.float16, torch.bfloat16):
            kernel = "sdpa"  # FlashAttention computes in half precision only
        if kernel == "varlen" and not varlen_attn_function().takes_scale:
            default_scale = q.shape[-1] ** -0.5
            kernel = "varlen" if abs(scale - default_scale) < 1e-12 else "sdpa"
        return kernel, first


def run_varlen(varlen: VarlenAttn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               cu_seq: tuple[torch.Tensor, torch.Tensor], max_len: tuple[int, int],
               scale: float) -> torch.Tensor:
    """One causal ``varlen_attn`` over packed rows: queries at offsets
    ``cu_seq[0]``, keys at ``cu_seq[1]`` (from 0), longest ``max_len``."""
    kwargs = dict(varlen.causal)
    if varlen.takes_scale:
        kwargs["scale"] = scale
    group = q.shape[1] // k.shape[1]
    if group > 1 and varlen.takes_gqa:
        kwargs["enable_gqa"] = True
    elif group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return varlen.fn(q, k, v, *cu_seq, *max_len, **kwargs)
