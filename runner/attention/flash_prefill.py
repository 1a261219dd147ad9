"""Prefill attention through torch's FlashAttention, the Triton backend otherwise.

A prompt with no cached prefix (query length = sequence length: nothing
before it in the cache) needs no paged reads: its keys and values are
exactly the step's own tokens. The runner orders a batch decodes first,
then short extends, then long prefills, so such prompts form a suffix of
the rows. On CUDA that suffix goes to ``torch.nn.attention.varlen.varlen_attn``
(FlashAttention inside torch) in one launch over its packed tokens, or,
where that module is missing, to ``scaled_dot_product_attention`` once per
prompt (its flash kernel for bf16 causal); the rows before it (decodes,
chunks after a cached prefix) take the Triton kernels as a batch of their
own. Batches without such a suffix, sliding windows and decode batches
(CUDA-graph capture among them) take the Triton kernels unchanged.

The step's K/V are gathered from the cache at ``slot_mapping`` (the model's
rotary kernel has already written them there), a copy of T x Hkv x D per
tensor, small beside the attention of T queries over T keys.

Host synchronisation: none. The choice reads the host copies of the
metadata only (``query_start_loc_cpu``, ``seq_lens_cpu``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from runner.attention.metadata import AttentionMetadata
from runner.attention.triton_attn import MAX_SPLITS, TritonAttentionBackend

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
    """"varlen" on CUDA where torch has it, else "sdpa" on CUDA, "triton" elsewhere
    (on CPU the Triton kernels run under the interpreter, as the backend's do)."""
    if torch.device(device).type != "cuda":
        return "triton"
    return "varlen" if varlen_attn_function() is not None else "sdpa"


def fresh_suffix_start(attn: AttentionMetadata, sliding_window: int | None) -> int | None:
    """First row of the longest suffix of rows that are whole prompts with
    nothing cached before them (query length == sequence length), when that
    suffix holds a prompt of more than one token; else None. Host ints only."""
    n = attn.num_reqs
    if n == 0 or sliding_window is not None or attn.max_query_len <= 1:
        return None
    starts = attn.query_start_loc_cpu[: n + 1]
    query_lens = starts[1:] - starts[:-1]
    fresh = (query_lens == attn.seq_lens_cpu[:n]).tolist()
    first = n
    while first > 0 and fresh[first - 1]:
        first -= 1
    if first == n or int(query_lens[first:].max()) <= 1:
        return None
    return first


def leading_rows(attn: AttentionMetadata, rows: int) -> AttentionMetadata:
    """The metadata of the batch's first ``rows`` rows alone."""
    starts, seq_lens = attn.query_start_loc_cpu[: rows + 1], attn.seq_lens_cpu[:rows]
    num_tokens = int(starts[-1])
    return AttentionMetadata(
        num_reqs=rows, num_tokens=num_tokens, num_decodes=min(attn.num_decodes, rows),
        max_query_len=int((starts[1:] - starts[:-1]).max()), max_seq_len=int(seq_lens.max()),
        query_start_loc=attn.query_start_loc[: rows + 1], seq_lens=attn.seq_lens[:rows],
        block_tables=attn.block_tables[:rows], slot_mapping=attn.slot_mapping[:num_tokens],
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens)


def gather_step_kv(kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                   num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's keys and values [num_tokens, Hkv, D], read back from the cache."""
    flat = kv_cache.flatten(1, 2)  # [2, blocks * block_size, Hkv, D]
    slots = slot_mapping[:num_tokens]
    return flat[0].index_select(0, slots), flat[1].index_select(0, slots)


def sdpa_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: list[int],
                 scale: float, out: torch.Tensor) -> None:
    """Causal attention of each prompt over its own tokens, one SDPA call each
    (K/V heads shared by query groups through ``enable_gqa``)."""
    for start, end in zip(starts, starts[1:]):
        if end == start:
            continue
        qi, ki, vi = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale,
                                            enable_gqa=True)
        out[start:end] = oi[0].transpose(0, 1)


class FlashPrefillBackend(TritonAttentionBackend):
    """The Triton backend with fresh prefills sent to torch's flash kernels.

    prefill_kernel: "varlen", "sdpa" or "triton" (never leave the Triton
    kernels); None picks ``default_prefill_kernel`` for the query's device.
    """

    def __init__(self, num_splits: int | None = None, max_splits: int = MAX_SPLITS,
                 prefill_kernel: str | None = None) -> None:
        super().__init__(num_splits, max_splits)
        if prefill_kernel is not None and prefill_kernel not in PREFILL_KERNELS:
            raise ValueError(f"prefill_kernel must be one of {PREFILL_KERNELS}, "
                             f"got {prefill_kernel!r}")
        if prefill_kernel == "varlen" and varlen_attn_function() is None:
            raise RuntimeError("torch.nn.attention.varlen.varlen_attn is not in this torch")
        self.prefill_kernel = prefill_kernel

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, attn: AttentionMetadata,
               scale: float, sliding_window: int | None = None) -> torch.Tensor:
        kernel, first = self.kernel_for(q, attn, scale, sliding_window)
        if kernel == "triton":
            return super().attend(q, kv_cache, attn, scale, sliding_window)
        starts = attn.query_start_loc_cpu[: attn.num_reqs + 1]
        begin, end = int(starts[first]), attn.num_tokens
        out = torch.empty_like(q)
        out[end:].zero_()
        if first > 0:
            out[:begin] = super().attend(q[:begin], kv_cache, leading_rows(attn, first), scale,
                                         sliding_window)
        k, v = gather_step_kv(kv_cache, attn.slot_mapping[begin:end], end - begin)
        if kernel == "sdpa":
            sdpa_prefill(q[begin:end], k, v, (starts[first:] - begin).tolist(), scale,
                         out[begin:end])
            return out
        cu_seq = attn.query_start_loc[first: attn.num_reqs + 1] - begin
        max_len = int((starts[first + 1:] - starts[first:-1]).max())
        out[begin:end] = run_varlen(varlen_attn_function(), q[begin:end].contiguous(), k, v,
                                    cu_seq, max_len, scale)
        return out

    def kernel_for(self, q: torch.Tensor, attn: AttentionMetadata, scale: float,
                   sliding_window: int | None) -> tuple[str, int]:
        """The kernel for the batch's fresh-prompt rows ("varlen", "sdpa" or,
        for the whole batch, "triton") and the first of those rows."""
        kernel = self.prefill_kernel or default_prefill_kernel(q.device)
        first = fresh_suffix_start(attn, sliding_window)
        if kernel == "triton" or first is None:
            return "triton", attn.num_reqs
        if kernel == "varlen" and not varlen_attn_function().takes_scale:
            default_scale = q.shape[-1] ** -0.5
            kernel = "varlen" if abs(scale - default_scale) < 1e-12 else "sdpa"
        return kernel, first


def run_varlen(varlen: VarlenAttn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               cu_seq: torch.Tensor, max_len: int, scale: float) -> torch.Tensor:
    """One causal ``varlen_attn`` over packed prompts (queries and keys share
    ``cu_seq``, token offsets from 0)."""
    kwargs = dict(varlen.causal)
    if varlen.takes_scale:
        kwargs["scale"] = scale
    group = q.shape[1] // k.shape[1]
    if group > 1 and varlen.takes_gqa:
        kwargs["enable_gqa"] = True
    elif group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return varlen.fn(q, k, v, cu_seq, cu_seq, max_len, max_len, **kwargs)
