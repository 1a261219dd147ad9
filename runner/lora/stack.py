"""The stacked LoRA factors of one projection, and the delta they add.

``L`` adapter slots, ``P`` parts (q/k/v of the fused qkv projection,
gate/up of the fused MLP projection, 1 elsewhere), rank padded to ``R``:

- ``a`` [L * P * R, in_local]: row block (l, p) is slot l's A of part p,
  its rows past the adapter's rank zero;
- ``b`` [out_local, L * P * R]: column block (l, p) is slot l's B of part
  p, scale folded in, placed in part p's output rows (zero elsewhere), its
  columns past the rank zero.

For tokens x [T, in_local], the step's token mask [T, L] (1 where the
token's request runs with slot l's adapter, ``LoRAAdapters.token_mask``)
and the same fact as one slot index a token (``token_slot`` [T], -1 for
none):

    delta = ((x @ a^T) * mask per slot block) @ b^T

``lora_add_delta_ref`` computes it so, over every slot: two matmuls, a
multiply and an add, static shapes, no gather of weights per token and no
host work, so it is captured in the decode graphs with the mask as one of
their inputs; its cost grows with L * P * R. On CUDA ``runner.ops`` gives
the Triton version (``triton_lora.py``), which reads per token only its
own slot's factors (``token_slot``), so the cost is one adapter's. Both
give a token of no adapter an exact zero delta (its y is left as it is).

``part_ends`` are the output rows where each part ends (q, k, v of a
column-parallel qkv shard: its q rows, then + k's, then + v's), so a kernel
can read of B only the rank columns of the part that owns an output row;
B is zero elsewhere.

Tensor parallelism: a column-parallel projection keeps A whole and the
rows of B that match its own output rows; a row-parallel one keeps the
columns of A that match its input columns and B whole, so its delta is a
partial sum that the layer's all-reduce adds up with the base output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.ops import device_ops


class LoRAStack:
    def __init__(self, num_slots: int, part_ends: tuple[int, ...], rank: int,
                 in_features: int, token_mask: torch.Tensor, token_slot: torch.Tensor,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.num_slots, self.parts, self.rank = num_slots, len(part_ends), rank
        self.part_ends = part_ends  # output rows where each part ends; the last: all
        width = num_slots * self.parts * rank
        self.a = torch.zeros(width, in_features, dtype=dtype, device=device)
        self.b = torch.zeros(part_ends[-1], width, dtype=dtype, device=device)
        # Both written each step (LoRAAdapters.prepare_tokens): [max tokens, L]
        # and [max tokens] (the slot index, -1 for none).
        self.token_mask, self.token_slot = token_mask, token_slot
        self.ops = device_ops(device)

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
        y [T, out_local], which the sum may be written into."""
        t = x.shape[0]
        return self.ops.lora_add_delta(x, y, self.a, self.b, self.token_mask[:t],
                                       self.token_slot[:t], self.part_ends)


def lora_add_delta_ref(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       token_mask: torch.Tensor, token_slot: torch.Tensor,
                       part_ends: tuple[int, ...]) -> torch.Tensor:
    """y + ((x @ a^T) * mask per slot block) @ b^T, over every slot (the
    module docstring); x [T, in], y [T, out], a [L * P * R, in], b [out,
    L * P * R], token_mask [T, L]. ``token_slot`` and ``part_ends`` are the
    Triton version's (the mask says the same)."""
    t = x.shape[0]
    shrunk = F.linear(x, a).view(t, token_mask.shape[1], -1)
    shrunk = shrunk * token_mask[:, :, None]
    return y + F.linear(shrunk.view(t, -1), b)
