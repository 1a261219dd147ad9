"""The gated MLP's activation: silu(gate) * up of a fused [T, 2I] projection.

``silu_and_mul_ref`` is the torch version (the CPU path and the oracle of
``triton_silu_mul.py``, which ``runner.ops`` picks on CUDA).
``gate_up_silu_ref`` is the projection and the activation together, the
oracle of ``triton_skinny_matmul.gate_up_silu`` (one launch for decode
batches on CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.layers.norm_in_matmul import normed_linear_ref


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] holding gate then up -> silu(gate) * up, [T, I], in the input dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gate_up_silu_ref(x: torch.Tensor, weight: torch.Tensor, parts: torch.Tensor | None = None,
                     eps: float = 0.0) -> torch.Tensor:
    """x [T, H] and the fused weight [2I, H] (gate rows, then up rows) ->
    silu(x @ gate.T) * (x @ up.T), [T, I]; the projection is rounded to the
    input dtype first, as when it is its own step. With ``parts``, x is the
    raw residual and the projection is ``normed_linear_ref``'s (the norm
    carried by the matmuls, ``norm_in_matmul.py``)."""
    if parts is None:
        return silu_and_mul_ref(F.linear(x, weight))
    return silu_and_mul_ref(normed_linear_ref(x, weight, parts, eps))
