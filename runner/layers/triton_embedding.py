"""The input embedding of a forward that carries its norms: rows and their parts in one launch.

Where the decoder norms are carried by the matmuls (``norm_in_matmul.py``),
every consumer reads the raw residual with its ``parts``, except layer 0's
qkv projection: the embedding's output has no producer before it, so the
first input norm ran as a launch of its own. This kernel is that producer:
program t copies row ``input_ids[t]`` of the table into the residual and
stores the sum of its squares as row t's one part (float32, of the stored
values), so layer 0 starts in the carried state like every other layer, and
the gather launches with programmatic dependent launch
(``runner/triton_dependent_launch.py``) where torch's embedding kernel
cannot.

Ids must be rows of the table (the engine checks prompts against the
vocabulary; sampled ids are in it): an id outside it reads zeros, where
torch's embedding would stop the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.layers.triton_norm_in_matmul import new_parts
from runner.ops import pdl_launch
from runner.triton_dependent_launch import wait_for_previous_kernel


@triton.jit
def _embedding_with_parts_kernel(ids_ptr, weight_ptr, out_ptr, parts_ptr, num_rows, hidden,
                                 stride_w, stride_out, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0)
    token = tl.load(ids_ptr + t).to(tl.int64)
    in_table = (token >= 0) & (token < num_rows)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    row = tl.load(weight_ptr + tl.where(in_table, token, 0) * stride_w + cols, mask=mask,
                  other=0.0)
    row = tl.where(in_table, row, 0.0).to(weight_ptr.dtype.element_ty)
    tl.store(out_ptr + t.to(tl.int64) * stride_out + cols, row, mask=mask)
    square = row.to(tl.float32)
    tl.store(parts_ptr + t, tl.sum(square * square, axis=0))


def embedding_with_parts_triton(input_ids: torch.Tensor,
                                weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``embedding_with_parts_ref``: (weight[input_ids] [T, H], parts
    float32 [T, 1]) in one launch. ``weight`` needs a unit last stride."""
    if weight.stride(-1) != 1:
        raise ValueError("embedding_with_parts needs the table's unit last stride")
    num_rows, hidden = weight.shape
    tokens = input_ids.shape[0]
    out = torch.empty(tokens, hidden, dtype=weight.dtype, device=weight.device)
    parts = new_parts(tokens, 1, weight.device)
    if tokens == 0:
        return out, parts
    block = triton.next_power_of_2(hidden)
    _embedding_with_parts_kernel[(tokens,)](
        input_ids, weight, out, parts, num_rows, hidden, weight.stride(0), out.stride(0),
        BLOCK=block, num_warps=min(8, max(1, block // 512)), **pdl_launch(weight.device))
    return out, parts
