"""The stacked LoRA factors of one projection, and the delta they add.

``L`` adapter slots, ``P`` parts (q/k/v of the fused qkv projection,
gate/up of the fused MLP projection, 1 elsewhere), rank padded to ``R``:

- ``a`` [L * P * R, in_local]: row block (l, p) is slot l's A of part p,
  its rows past the adapter's rank zero;
- ``b`` [out_local, L * P * R]: column block (l, p) is slot l's B of part
  p, scale folded in, placed in part p's output rows (zero elsewhere), its
  columns past the rank zero.

For tokens x [T, in_local] and the step's token mask [T, L] (1 where the
token's request runs with slot l's adapter, ``LoRAAdapters.token_mask``):

    delta = ((x @ a^T) * mask per slot block) @ b^T

Two matmuls over every slot and a multiply: static shapes, no gather of
weights per token and no host work, so the delta is captured in the decode
graphs with the mask as one of their inputs; a token of no adapter gets an
exact zero. The cost grows with L * P * R (a Triton kernel that gathers
each token's slot would not).

Tensor parallelism: a column-parallel projection keeps A whole and the
rows of B that match its own output rows; a row-parallel one keeps the
columns of A that match its input columns and B whole, so its delta is a
partial sum that the layer's all-reduce adds up with the base output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class LoRAStack:
    def __init__(self, num_slots: int, parts: int, rank: int, in_features: int,
                 out_features: int, token_mask: torch.Tensor, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.num_slots, self.parts, self.rank = num_slots, parts, rank
        width = num_slots * parts * rank
        self.a = torch.zeros(width, in_features, dtype=dtype, device=device)
        self.b = torch.zeros(out_features, width, dtype=dtype, device=device)
        self.token_mask = token_mask  # [max tokens, L], written each step

    def columns(self, slot: int, part: int) -> slice:
        """The rows of ``a`` (columns of ``b``) of one slot's part."""
        start = (slot * self.parts + part) * self.rank
        return slice(start, start + self.rank)

    def clear(self, slot: int) -> None:
        """Zero every factor of ``slot`` (before an adapter is loaded there)."""
        block = slice(slot * self.parts * self.rank, (slot + 1) * self.parts * self.rank)
        self.a[block].zero_()
        self.b[:, block].zero_()

    def add_delta(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y + the delta of x's tokens (module docstring); x [T, in_local],
        y [T, out_local]."""
        t = x.shape[0]
        shrunk = F.linear(x, self.a).view(t, self.num_slots, -1)
        shrunk = shrunk * self.token_mask[:t, :, None]
        return y + F.linear(shrunk.view(t, -1), self.b)
