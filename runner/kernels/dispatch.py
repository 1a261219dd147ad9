"""Helpers the input kernels share (sizes, token rows)."""

from __future__ import annotations

import torch


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= max(n, 1) (Triton block sizes must be powers of 2)."""
    return 1 << max(n - 1, 0).bit_length()


def check_num_reqs(num_reqs: int, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor) -> None:
    """Raise ValueError unless the host-known batch size fits the device buffers."""
    if num_reqs < 0 or num_reqs > idx_mapping.shape[0]:
        raise ValueError(
            f"num_reqs={num_reqs} outside [0, {idx_mapping.shape[0]}] (idx_mapping size)"
        )
    if query_start_loc.shape[0] < num_reqs + 1:
        raise ValueError(
            f"query_start_loc has {query_start_loc.shape[0]} entries, needs num_reqs + 1 ="
            f" {num_reqs + 1}"
        )


def token_rows(query_start_loc: torch.Tensor, num_reqs: int, num_tokens: int) -> torch.Tensor:
    """Batch row of each token 0 .. num_tokens-1 (int64, on the device of query_start_loc).

    Row i owns tokens query_start_loc[i] .. query_start_loc[i+1]-1. A token at or
    past query_start_loc[num_reqs] gets row num_reqs (no row). Fixed shape, no sync.
    """
    ends = query_start_loc[1 : num_reqs + 1].to(torch.int64)
    tokens = torch.arange(num_tokens, device=query_start_loc.device, dtype=torch.int64)
    return torch.searchsorted(ends, tokens, right=True)
