"""Fresh prompts through torch's fused attention (SDPA), reading their own k and v.

A fresh row is one whose whole sequence is this step's query: no cached
prefix (seq_len == query_len). Its keys and values are exactly the k and v
the step computed, so attention needs nothing from the paged cache: SDPA
reads them where the qkv projection left them. The token-major layout
[T, H, D] viewed as [1, H, T, D] is the layout torch's fused kernels work
in, so neither the inputs nor the output are copied; rows of equal length
(prompts of one batch often are) go in one batched call.

The runner orders a batch decodes first, then rows by growing token count,
so fresh long rows form a suffix; the Triton kernels attend the rows before
it as a batch of their own. Only eager steps take this path: its launches
depend on host-known row lengths, which a CUDA graph cannot follow (the
Triton kernels serve captured steps). Host ints only, no device sync.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.attention.metadata import AttentionMetadata


def fresh_suffix_start(attn: AttentionMetadata, min_tokens: int,
                       sliding_window: int | None) -> int | None:
    """First row of the batch's trailing fresh rows of at least ``min_tokens``
    tokens each, or None when there is none (or a window, or drafts: their
    host seq_lens are upper bounds)."""
    n = attn.num_reqs
    if (n == 0 or sliding_window is not None or attn.num_draft_rows
            or attn.max_query_len < min_tokens):
        return None
    starts = attn.query_start_loc_cpu[: n + 1].tolist()
    seq_lens = attn.seq_lens_cpu[:n].tolist()
    first = n
    while first > 0:
        q_len = starts[first] - starts[first - 1]
        if q_len < min_tokens or seq_lens[first - 1] != q_len:
            break
        first -= 1
    return first if first < n else None


def equal_length_runs(starts: list[int]) -> list[tuple[int, int, int]]:
    """(first token, rows, row length) of each run of consecutive rows of one
    length, rows given by their token offsets ``starts``."""
    runs: list[tuple[int, int, int]] = []
    for begin, end in zip(starts, starts[1:]):
        length = end - begin
        if runs and runs[-1][2] == length:
            first, rows, _ = runs[-1]
            runs[-1] = (first, rows + 1, length)
        else:
            runs.append((begin, 1, length))
    return runs


def attend_fresh_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: list[int],
                      scale: float) -> list[tuple[int, torch.Tensor]]:
    """Causal attention of each fresh row (tokens ``starts[i] .. starts[i+1]``
    of q [T, Hq, D], k and v [T, Hkv, D], its own keys only). Returns
    (first token, output [tokens, Hq, D]) per run of equal-length rows."""
    outputs = []
    for first, rows, length in equal_length_runs(starts):
        end = first + rows * length
        qi, ki, vi = (x[first:end].unflatten(0, (rows, length)).transpose(1, 2)
                      for x in (q, k, v))
        oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale,
                                            enable_gqa=qi.shape[1] != ki.shape[1])
        outputs.append((first, oi.transpose(1, 2).flatten(0, 1)))
    return outputs
