"""Triton kernel that merges split-KV (flash-decoding) partial results.

For one (token, query head), split s left an unnormalised accumulator acc_s, the
running max m_s (base-2 logits) and the sum l_s of exp2(logit - m_s). With
M = max_s m_s and w_s = exp2(m_s - M), the attention output is
    sum_s w_s * acc_s / sum_s w_s * l_s.
Empty splits carry m_s = -inf and weigh nothing: their acc_s is never read
(an empty split does not write it); a token with no key at all (padding) gets
zeros, never NaN.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.ops import launch_pdl
from runner.triton_dependent_launch import wait_for_previous_kernel


@triton.jit
def _merge_splits_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    num_q_heads,
    head_dim,
    stride_o_tok,
    stride_o_head,
    num_splits,
    SPLITS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, DIM_PAD)
    split_mask = splits < num_splits
    dim_mask = dims < head_dim
    base = (tok * num_q_heads + head) * num_splits

    m = tl.load(part_max_ptr + base + splits, mask=split_mask, other=float("-inf"))
    l_s = tl.load(part_sum_ptr + base + splits, mask=split_mask, other=0.0)
    m_max = tl.max(m, axis=0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_safe)
    total = tl.sum(w * l_s, axis=0)

    acc_off = (base + splits)[:, None] * head_dim + dims[None, :]
    has_keys = split_mask & (m > float("-inf"))
    acc = tl.load(part_acc_ptr + acc_off, mask=has_keys[:, None] & dim_mask[None, :], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    o_off = tok * stride_o_tok + head * stride_o_head + dims
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=dim_mask)


def merge_splits(
    out: torch.Tensor, part_acc: torch.Tensor, part_max: torch.Tensor, part_sum: torch.Tensor
) -> None:
    """out[t, h] = merge of part_*[t, h, :]; shapes as in the module docstring.

    out is [T, Hq, D]; part_acc is a contiguous [T, Hq, S, D] float32 tensor and
    part_max, part_sum contiguous [T, Hq, S] float32 tensors.
    """
    num_tokens, num_q_heads, head_dim = out.shape
    num_splits = part_acc.shape[2]
    if num_tokens == 0:
        return
    pdl = launch_pdl(out.device)
    _merge_splits_kernel[(num_tokens, num_q_heads)](
        out,
        part_acc,
        part_max,
        part_sum,
        num_q_heads,
        head_dim,
        out.stride(0),
        out.stride(1),
        num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        DIM_PAD=triton.next_power_of_2(head_dim),
        PDL=pdl,
        launch_pdl=pdl,
    )
