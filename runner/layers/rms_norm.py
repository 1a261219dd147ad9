"""Root-mean-square layer norm, computed in float32 as Hugging Face Llama does.

The device's operations (``runner.ops``) do the work: on CUDA one Triton
kernel (``triton_rms_norm.py``), fused with the residual add that precedes
every norm inside the decoder; elsewhere the torch code below, which is also
the kernel's test oracle.
"""

from __future__ import annotations

import torch
from torch import nn

from runner.distributed import TensorParallelGroup
from runner.ops import device_ops


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)) over the last dimension.

    The normalization runs in float32; the result is cast back to x's dtype
    before the weight multiplies it.
    """

    def __init__(self, size: int, eps: float, dtype: torch.dtype,
                 reduce_over: TensorParallelGroup | None = None) -> None:
        super().__init__()
        self.eps = eps
        # Set for norms that follow a row-parallel layer whose reduction was
        # deferred: with a residual, x is this rank's partial sum.
        self.reduce_over = reduce_over
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.ops = device_ops(self.weight.device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x), or with ``residual``: (norm(x + residual), x + residual).

        The second form is the decoder's "add then norm": the sum is the next
        residual. On CUDA it is written into ``residual``'s storage. With
        ``reduce_over`` and a residual, ``x`` is summed over the ranks first.
        """
        if residual is not None and self.reduce_over is not None and self.reduce_over.size > 1:
            return self.reduce_over.all_reduce_add_rms_norm(
                x, residual, self._add_norm, self.weight, self.eps)
        return self._add_norm(x, residual)

    def _add_norm(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.fused_add_rms_norm(x, residual, self.weight, self.eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Torch reference: float32 normalization, rounded, then times weight."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual); the sum is a new tensor."""
    summed = x + residual
    return rms_norm_ref(summed, weight, eps), summed
