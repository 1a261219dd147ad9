"""The decoder's RMSNorms carried by the matmuls around them (TP=1 decode batches).

A decoder norm sits between a producer, the projection whose output is
added to the residual stream (o_proj, down), and a consumer, the projection
that reads the normed stream (gate/up, the next layer's qkv). Launched on
its own it costs a kernel boundary twice a layer. Written out,

    consumer(norm(r)) = W (g * r * rstd(r)) = rstd(r) * ((W diag g) r),
    rstd(r) = 1 / sqrt(mean(r^2) + eps),

so with the norm's weight g folded into the consumer's columns once, at
load (``fold_norm_weight``), the consumer can read the raw residual r as
its dot operand, unchanged (a computed operand stalls the weight pipeline),
and scale each row's sums by rstd(r) in its epilogue. rstd needs the sum of
r^2 over the whole row, which no consumer program sees alone: the producer
computes it. Its epilogue adds its output to the residual in place (the
residual add that the norm kernel did) and stores, per row and per program,
the sum of squares of the columns it wrote: the ``parts`` [rows, P] in
float32, P the producer's column groups. The consumer sums a row's parts in
its epilogue. Nothing is normalized in memory and no launch is left between
the two projections.

Arithmetic. The residual sum is rounded to the model dtype as the norm
kernel rounds it, and the parts are of that rounded sum. The consumer's
float32 sums are scaled by rstd and rounded once; Hugging Face rounds the
normalized input, then its product with g, then the projection. The fold
rounds W * g to the weight dtype. Results agree to that rounding (the
parity tests compare logits with HF; tokens are compared in float32).

The functions here are the torch references (the CPU path and the oracle of
the Triton epilogues in ``triton_skinny_matmul.py``,
``triton_medium_matmul.py`` and ``triton_qkv_rotary.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fold_norm_weight(linear_weight: torch.Tensor, norm_weight: torch.Tensor) -> None:
    """W <- W diag(g), in place, computed in float32 and rounded once; then
    g <- 1, so the norm module applied on its own still gives the same
    consumer input: norm(x) with g = 1, then the folded weight."""
    folded = linear_weight.float() * norm_weight.float()
    linear_weight.copy_(folded)
    norm_weight.fill_(1.0)


def row_sum_of_squares(residual: torch.Tensor) -> torch.Tensor:
    """parts of one part a row: sum of residual^2 in float32, [rows, 1]."""
    r = residual.float()
    return (r * r).sum(-1, keepdim=True)


def rstd_from_parts(parts: torch.Tensor, width: int, eps: float) -> torch.Tensor:
    """1 / sqrt(sum(parts[m]) / width + eps) per row, float32 [rows]."""
    return torch.rsqrt(parts.sum(-1) / width + eps)


def normed_linear_ref(x: torch.Tensor, weight: torch.Tensor, parts: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """rstd(x) * (x @ weight.T), the sums in float32, rounded once to x's
    dtype; rstd from ``parts`` (``rstd_from_parts`` over x's width)."""
    rstd = rstd_from_parts(parts, x.shape[-1], eps)
    return (F.linear(x.float(), weight.float()) * rstd[:, None]).to(x.dtype)


def embedding_with_parts_ref(input_ids: torch.Tensor,
                            weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first producer of a forward that carries its norms: the embedded
    rows weight[input_ids] (a new tensor: the residual the layers add into)
    and their parts, one a row (``row_sum_of_squares``)."""
    rows = F.embedding(input_ids, weight)
    return rows, row_sum_of_squares(rows)


def row_parallel_matmul_add_ref(x: torch.Tensor, weight: torch.Tensor,
                                residual: torch.Tensor) -> torch.Tensor:
    """residual <- x @ weight.T + residual in place (the product rounded to
    the dtype first, then the sum, as the unfused pair rounds them); returns
    the new residual's parts (one a row)."""
    residual.copy_(F.linear(x, weight) + residual)
    return row_sum_of_squares(residual)


def norms_in_matmuls_ref(rows: int, dtype: torch.dtype, device: torch.device,
                         qkv_weight: torch.Tensor, o_weight: torch.Tensor,
                         gate_up_weight: torch.Tensor, down_weight: torch.Tensor,
                         head_dim: int) -> bool:
    """Whether a forward of ``rows`` tokens carries its norms in the matmuls,
    where the torch references run: always (the references take any size;
    the norms' own launches cost nothing to avoid here, but this way the
    CPU path runs the same arithmetic as a CUDA decode step)."""
    return True
