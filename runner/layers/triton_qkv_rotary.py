"""The qkv projection of a decode batch, rotary and the KV-cache write in one launch.

At batch 1-16 the qkv projection is a matrix-vector product bound by reading
its weight once, and the rotary kernel after it (``rotary_write_kv_triton``)
is a launch of a few microseconds that only rotates q and k and stores k and
v in the paged cache. Here each program computes BLOCK_P rotary pairs of one
head for every row, as the skinny matmul (triton_skinny_matmul.py) computes
its columns: it loads the BLOCK_P weight rows of the first half of the head
and the BLOCK_P rows of the second half that pair with them, so the rotation
x1 cos - x2 sin, x2 cos + x1 sin happens in registers. A q head's pairs go to
the returned q, a k head's rotated pairs and a v head's plain outputs to the
token's cache slot. The fused [M, (Hq + 2 Hkv) D] projection never reaches
memory.

Arithmetic. Each product is rounded to the input dtype first, then rotated
in float32 and rounded again: the unfused pair's rounding (cuBLAS output,
then ``rotary_write_kv_triton``); only the order of the sum over K differs.
Tokens whose slot is -1, or that lie past the end of ``slot_mapping``, store
no key or value (their q is still written). Where the pairs' programs are
too few for the SMs (the 1B shape: 48), each group of pairs is read by
several programs over ranges of K, the last of which rotates and stores
(``split_k.py``).

``qkv_rotary_write_kv`` takes this kernel where ``uses_skinny_qkv_rotary``
says it applies, the medium kernel's rotary epilogue for 17..64 rows
(``triton_medium_matmul.medium_qkv_rotary_write_kv``; the epilogue is the
same helper, ``qkv_rotary_epilogue.py``), and is otherwise the projection
(cuBLAS or the medium matmul) followed by the rotary kernel. It launches with programmatic dependent launch where the
device has it (``runner/triton_dependent_launch.py``).

Given the ``parts`` of a producer (``norm_in_matmul.py``), x is the raw
residual and every path carries the norm: the fused kernels scale each
row's float32 sums by its rstd before the epilogue (NORM,
``triton_norm_in_matmul.py``), the unfused path's projection is
``normed_linear_ref``'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runner.layers.norm_in_matmul import normed_linear_ref
from runner.layers.qkv_rotary_epilogue import check_qkv_rotary, rotate_and_store_pairs
from runner.layers.split_k import (
    choose_split_k,
    split_k_bounds,
    split_k_buffers,
    split_k_range,
    sum_split_parts,
)
from runner.layers.triton_medium_matmul import (
    medium_or_cublas,
    medium_qkv_rotary_write_kv,
    uses_medium_qkv_rotary,
)
from runner.layers.triton_norm_in_matmul import norm_args, rstd_of_rows
from runner.layers.triton_rotary import rotary_write_kv_triton
from runner.layers.triton_skinny_matmul import ROW_TILE, check_rows, skinny_inputs
from runner.ops import num_sms, pdl_launch
from runner.ticket_counters import take_ticket
from runner.triton_dependent_launch import let_next_kernel_start, wait_for_previous_kernel

BLOCK_P = 32  # rotary pairs a program: it reads 2 * BLOCK_P weight rows


@triton.jit
def _skinny_qkv_rotary_kernel(
    x_ptr, w_ptr, positions_ptr, cos_ptr, sin_ptr, q_out_ptr, key_cache_ptr, value_cache_ptr,
    slot_mapping_ptr, workspace_ptr, counters_ptr, parts_ptr, M, num_slots, K, K_PER_SPLIT,
    stride_x, stride_w, stride_q_tok, stride_c_block,
    stride_c_slot, stride_c_head, num_q_heads, num_kv_heads, num_parts, eps,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    M_PAD: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    P_PAD: tl.constexpr, PDL: tl.constexpr,
):
    """Pairs (p, p + HALF) for p in this program's BLOCK_P of one head, every
    row; program (j, s) reads K columns s * K_PER_SPLIT on (split_k.py).
    P_PAD > 0 (NORM): the sums of row m are first scaled by its rstd from
    ``parts_ptr`` [M, num_parts] (``rstd_of_rows``); P_PAD = 0 leaves
    parts_ptr, num_parts and eps None."""
    NORM: tl.constexpr = P_PAD > 0
    wait_for_previous_kernel(PDL, LET_NEXT_START=not NORM)
    HALF: tl.constexpr = HEAD_DIM // 2
    CHUNKS: tl.constexpr = HALF // BLOCK_P
    head = tl.program_id(0) // CHUNKS
    pairs = (tl.program_id(0) % CHUNKS) * BLOCK_P + tl.arange(0, BLOCK_P)
    rows = tl.arange(0, M_PAD)
    row_mask = rows < M
    lo_rows = (head * HEAD_DIM + pairs)[:, None].to(tl.int64) * stride_w
    hi_rows = lo_rows + HALF * stride_w
    acc_lo = tl.zeros([M_PAD, BLOCK_P], dtype=tl.float32)
    acc_hi = tl.zeros([M_PAD, BLOCK_P], dtype=tl.float32)
    k_lo, k_hi = split_k_bounds(K, K_PER_SPLIT, SPLIT_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks[None, :] < k_hi
        a = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :],
                    mask=row_mask[:, None] & k_mask, other=0.0)
        w_lo = tl.load(w_ptr + lo_rows + ks[None, :], mask=k_mask, other=0.0)
        w_hi = tl.load(w_ptr + hi_rows + ks[None, :], mask=k_mask, other=0.0)
        acc_lo += tl.dot(a, tl.trans(w_lo), input_precision=DOT_PRECISION)
        acc_hi += tl.dot(a, tl.trans(w_hi), input_precision=DOT_PRECISION)
    if NORM and SPLIT_K == 1:
        let_next_kernel_start(PDL)
    if SPLIT_K > 1:  # a part each of lo and hi; the group's last program sums them
        PART: tl.constexpr = M_PAD * BLOCK_P
        offs = rows[:, None] * BLOCK_P + tl.arange(0, BLOCK_P)[None, :]
        parts = workspace_ptr + tl.program_id(0).to(tl.int64) * (SPLIT_K * 2 * PART)
        mine = parts + tl.program_id(1) * (2 * PART)
        tl.store(mine + offs, acc_lo)
        tl.store(mine + PART + offs, acc_hi)
        if not take_ticket(counters_ptr + tl.program_id(0), SPLIT_K):
            return
        acc_lo = sum_split_parts(parts, offs, 2 * PART, SPLIT_K)
        acc_hi = sum_split_parts(parts + PART, offs, 2 * PART, SPLIT_K)
    if NORM:
        rstd = rstd_of_rows(parts_ptr, rows, row_mask, num_parts, K, eps, P_PAD)[:, None]
        acc_lo *= rstd
        acc_hi *= rstd
    rotate_and_store_pairs(acc_lo, acc_hi, head, pairs, rows, row_mask, positions_ptr, cos_ptr,
                           sin_ptr, q_out_ptr, stride_q_tok, key_cache_ptr, value_cache_ptr,
                           slot_mapping_ptr, num_slots, stride_c_block, stride_c_slot,
                           stride_c_head, num_q_heads, num_kv_heads, HEAD_DIM, BLOCK_SIZE,
                           ROW_AXIS=0)


def uses_skinny_qkv_rotary(x: torch.Tensor, weight: torch.Tensor, head_dim: int) -> bool:
    """Whether ``qkv_rotary_write_kv`` takes the one-launch kernel: inputs
    every skinny kernel takes (``skinny_inputs``), BLOCK_P dividing half a
    head, and programs for at least a third of the SMs
    (fewer leave the weight read to too few SMs; cuBLAS's split-K serves
    those)."""
    if not (skinny_inputs(x, weight) and head_dim % (2 * BLOCK_P) == 0):
        return False
    programs = weight.shape[0] // (2 * BLOCK_P)
    return programs >= num_sms(x.device) // 3


def skinny_qkv_rotary_write_kv(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor,
                               cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                               slot_mapping: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                               block_p: int = BLOCK_P, block_k: int = 256, num_warps: int = 4,
                               num_stages: int = 4, split_k: int | None = None,
                               parts: torch.Tensor | None = None,
                               eps: float = 0.0) -> torch.Tensor:
    """x [M, K], weight [(Hq + 2 Hkv) D, K] (q rows, k rows, v rows) -> rotated
    q [M, Hq, D]; rotated k and v stored at ``slot_mapping`` in ``kv_cache``
    [2, blocks, block_size, Hkv, D]. M <= SKINNY_MAX_ROWS, unit last strides.
    With ``parts`` (float32 [M, P], a producer's) x is the raw residual, as
    in ``qkv_rotary_write_kv_ref``."""
    m, k = x.shape
    head_dim = kv_cache.shape[-1]
    check_rows("skinny_qkv_rotary_write_kv", m)
    check_qkv_rotary("skinny_qkv_rotary_write_kv", x, weight, kv_cache, num_q_heads,
                     num_kv_heads, block_p)
    norm = norm_args("skinny_qkv_rotary_write_kv", parts, eps, m)
    q = torch.empty(m, num_q_heads, head_dim, dtype=x.dtype, device=x.device)
    if m == 0:
        return q
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    programs = (num_q_heads + 2 * num_kv_heads) * (head_dim // (2 * block_p))
    if split_k is None:
        split_k = choose_split_k(programs, k, block_k, num_sms(x.device))
    workspace, counters = split_k_buffers(split_k, programs, 2 * ROW_TILE * block_p, x.device)
    _skinny_qkv_rotary_kernel[(programs, split_k)](
        x, weight, positions, cos, sin, q, key_cache, value_cache, slot_mapping, workspace,
        counters, norm["parts_ptr"], m, slot_mapping.shape[0], k,
        split_k_range(k, block_k, split_k), x.stride(0), weight.stride(0), q.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), num_q_heads,
        num_kv_heads, norm["num_parts"], norm["eps"], HEAD_DIM=head_dim,
        BLOCK_SIZE=key_cache.shape[1],
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", M_PAD=ROW_TILE,
        BLOCK_P=block_p, BLOCK_K=block_k, SPLIT_K=split_k, P_PAD=norm["P_PAD"],
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(x.device))
    return q


def qkv_rotary_write_kv(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor,
                        cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                        slot_mapping: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                        parts: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """``qkv_rotary_write_kv_ref`` on CUDA: one launch for decode batches
    (the skinny kernel up to 16 rows, ``uses_skinny_qkv_rotary``; the
    medium one for 17..64, ``uses_medium_qkv_rotary``), elsewhere the
    projection (``medium_or_cublas``: cuBLAS or the medium matmul) and then
    the rotary kernel. ``parts``: as the reference's."""
    head_dim = kv_cache.shape[-1]
    args = (x, weight, positions, cos, sin, kv_cache, slot_mapping, num_q_heads, num_kv_heads)
    if uses_skinny_qkv_rotary(x, weight, head_dim):
        return skinny_qkv_rotary_write_kv(*args, parts=parts, eps=eps)
    if uses_medium_qkv_rotary(x, weight, head_dim):
        return medium_qkv_rotary_write_kv(*args, parts=parts, eps=eps)
    return unfused_qkv_rotary_write_kv(medium_or_cublas, *args, parts, eps)


def unfused_qkv_rotary_write_kv(matmul, x: torch.Tensor, weight: torch.Tensor,
                                positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                                num_q_heads: int, num_kv_heads: int,
                                parts: torch.Tensor | None = None,
                                eps: float = 0.0) -> torch.Tensor:
    """The projection through ``matmul(x, weight)``, then the rotary kernel
    (two launches; ``bench_decode.py --cublas-only`` takes it with
    ``F.linear`` at every size). With ``parts`` the projection is
    ``normed_linear_ref``'s whatever ``matmul``: float32 sums scaled by
    rstd and rounded once, which no rounded product can be scaled into."""
    head_dim = kv_cache.shape[-1]
    projection = (matmul(x, weight) if parts is None
                  else normed_linear_ref(x, weight, parts, eps))
    heads = projection.unflatten(-1, (-1, head_dim))
    q, k, v = heads.split([num_q_heads, num_kv_heads, num_kv_heads], dim=1)
    return rotary_write_kv_triton(positions, q, k, v, cos, sin, kv_cache, slot_mapping)
