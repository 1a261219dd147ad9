"""The gated MLP's activation: silu(gate) * up of a fused [T, 2I] projection.

``silu_and_mul_ref`` is the torch version (the CPU path and the oracle of
``triton_silu_mul.py``, which ``runner.ops`` picks on CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] holding gate then up -> silu(gate) * up, [T, I], in the input dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
