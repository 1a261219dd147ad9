"""Triton matmul for decode batches of 17..MEDIUM_MAX_ROWS rows: out = x @ w.T.

At 17-64 rows a projection is still bound by reading its weight once, but
the skinny kernels (``triton_skinny_matmul.py``) no longer fit: they make x
the dot's A operand, padded to the row tile, and give each program only a
few weight rows, so every program re-reads the whole x from L2 (as many
bytes as its own weight rows) and holds a tall accumulator. Here the
operands are swapped: a program owns BLOCK_N weight rows (outputs) and
computes acc[BLOCK_N, M_PAD] = w_tile @ x_tile.T, so the weight is the
dot's large operand (Hopper's wgmma M of 64 or 128) and the batch its small
N, M_PAD = 32 or 64 (the next power of two of the rows, at least 32). x is
then read once per BLOCK_N weight rows, and the accumulator is stored
transposed into out[m, n].

Where the column groups are too few for the SMs, each is read by SPLIT_K
programs over ranges of K; the last of a group sums the float32 parts in
split order and runs the epilogue, in the same launch (``split_k.py``,
``runner/ticket_counters.py``): no second reduce launch as cuBLAS's split-K
needs.

Epilogues. The plain one rounds the sum to the output dtype (o_proj, down,
qkv before its rotary kernel). The gate/up one (``medium_gate_up_silu``)
has a program read its BLOCK_N gate rows and the BLOCK_N up rows of the same
outputs as one tile of 2 * BLOCK_N rows (HALVES = 2), so the K loop is the
plain one; the epilogue splits the accumulator into its halves and writes
silu(gate) * up with the unfused pair's rounding (``silu_mul_rounded``).
The qkv + rotary one (``medium_qkv_rotary_write_kv``, HEAD_DIM > 0) reads
the same way BLOCK_N rotary pairs (p, p + HEAD_DIM / 2) of one head: the
first half of its tile the pairs' rows, the second the rows half a head on
(only the rows' offset differs from gate/up's, so the K loop is the same);
the epilogue rotates q and k and stores q, and k and v into the paged KV
cache (``qkv_rotary_epilogue.rotate_and_store_pairs``, shared with the
skinny qkv kernel), so the projection never reaches memory.

The decoder's norms ride on these epilogues where asked (``norm_in_matmul.py``,
``triton_norm_in_matmul.py``): the plain one adds its sums into the
residual in place and stores the new residual's parts (ADD_RESIDUAL,
``medium_matmul_add``: o_proj, down); the gate/up and qkv + rotary ones,
given parts, read the raw residual as x and first scale each row's sums by
its rstd (NORM: P_PAD > 0).

Weight tiles come from pointer loads, or with ``tma=True`` from a host-built
tensor descriptor (Hopper's TMA): the weight viewed as [HALVES, N, K] with
a box of [HALVES, BLOCK_N, BLOCK_K], which fetches the gate and up rows of a
program in one copy and zero-fills past N and K. A host descriptor needs no
device allocator (an in-kernel ``tl.make_tensor_descriptor`` would need
``triton.set_allocator`` process-wide), and a CUDA graph keeps it as a
launch parameter. Splits start at multiples of BLOCK_K, so no tile crosses
into the next split's K range and only K's end needs masking. The qkv +
rotary launch reads pointer tiles only.

Configs (tile, split, warps, stages) are per projection shape in
``TUNED_CONFIGS`` (``bench_gemv.py --medium`` sweeps them); shapes not listed
take ``DEFAULT_CONFIGS``. A shape tuned to None goes to cuBLAS (qkv_rotary:
the projection, then the rotary kernel). The runner
takes these kernels while ``MEDIUM_MATMUL_ENABLED`` (the one switch for an
A/B against cuBLAS) and ``uses_medium_matmul`` says the inputs fit. The
kernel launches with programmatic dependent launch where the device has it
(``runner/triton_dependent_launch.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from runner.layers.dot_inputs import dot_inputs
from runner.layers.qkv_rotary_epilogue import check_qkv_rotary, rotate_and_store_pairs
from runner.layers.split_k import (
    choose_split_k,
    split_k_bounds,
    split_k_buffers,
    split_k_range,
    sum_split_parts,
)
from runner.layers.triton_norm_in_matmul import (
    NO_NORM,
    add_residual_and_store_parts,
    check_residual,
    new_parts,
    norm_args,
    rstd_of_rows,
)
from runner.layers.triton_silu_mul import silu_mul_rounded
from runner.ops import num_sms, pdl_launch
from runner.ticket_counters import take_ticket
from runner.triton_dependent_launch import let_next_kernel_start, wait_for_previous_kernel

# The switch of the runner's routing: False sends every 17..64-row
# projection to cuBLAS (as before these kernels), for an A/B.
MEDIUM_MATMUL_ENABLED = True

MEDIUM_MIN_ROWS = 17  # fewer go to the skinny kernels
MEDIUM_MAX_ROWS = 64  # more go to cuBLAS, whose tiles then reuse the weight better

# Config of a shape not in TUNED_CONFIGS, by kind. gate_up reads 2 * block_n
# weight rows a program, so half the plain tile keeps the same shared memory.
DEFAULT_CONFIGS = {
    "matmul": dict(block_n=128, block_k=128, split_k=None, num_warps=4, num_stages=4,
                   tma=False),
    "gate_up": dict(block_n=64, block_k=128, split_k=None, num_warps=4, num_stages=4,
                    tma=False),
    "qkv_rotary": dict(block_p=32, block_k=128, split_k=None, num_warps=4, num_stages=4),
}
# (kind, weight rows, K, M_PAD) -> config (the keyword arguments of
# medium_matmul / medium_gate_up_silu / medium_qkv_rotary_write_kv), or None:
# cuBLAS for that shape (qkv_rotary: the projection, then the rotary kernel).
# gate_up's weight rows are gate and up together (2 * intermediate size),
# qkv_rotary's the q, k and v heads' ((Hq + 2 Hkv) * head_dim).
# bench_gemv.py --medium prints each winner's key and config. o_proj at 64
# rows keeps the kernel although cuBLAS is ahead of it alone: there it lets
# the step carry the decoder norms (triton_norm_in_matmul.py), which the
# step measured faster.
TUNED_CONFIGS: dict[tuple[str, int, int, int], dict | None] = {
    # Llama-3.1-8B at TP=1 (H200): qkv, o_proj, gate_up, down, qkv + rotary.
    ("matmul", 6144, 4096, 32): dict(block_n=64, block_k=256, split_k=1, num_warps=4, num_stages=4, tma=True),
    ("matmul", 6144, 4096, 64): None,
    ("matmul", 4096, 4096, 32): dict(block_n=64, block_k=128, split_k=2, num_warps=4, num_stages=5, tma=False),
    ("matmul", 4096, 4096, 64): dict(block_n=64, block_k=128, split_k=2, num_warps=4, num_stages=5, tma=False),
    ("gate_up", 28672, 4096, 32): dict(block_n=128, block_k=128, split_k=1, num_warps=8, num_stages=3, tma=False),
    ("gate_up", 28672, 4096, 64): dict(block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=4, tma=False),
    ("matmul", 4096, 14336, 32): dict(block_n=64, block_k=128, split_k=2, num_warps=4, num_stages=5, tma=False),
    ("matmul", 4096, 14336, 64): dict(block_n=64, block_k=128, split_k=2, num_warps=4, num_stages=5, tma=False),
    ("qkv_rotary", 6144, 4096, 32): dict(block_p=32, block_k=128, split_k=1, num_warps=4, num_stages=5),
    ("qkv_rotary", 6144, 4096, 64): dict(block_p=32, block_k=128, split_k=1, num_warps=4, num_stages=5),
    # Llama-3.2-1B at TP=1 (H200).
    ("matmul", 3072, 2048, 32): None,
    ("matmul", 3072, 2048, 64): None,
    ("matmul", 2048, 2048, 32): dict(block_n=64, block_k=128, split_k=4, num_warps=4, num_stages=4, tma=False),
    ("matmul", 2048, 2048, 64): dict(block_n=64, block_k=128, split_k=4, num_warps=4, num_stages=4, tma=False),
    ("gate_up", 16384, 2048, 32): dict(block_n=64, block_k=128, split_k=None, num_warps=4, num_stages=4, tma=False),
    ("gate_up", 16384, 2048, 64): dict(block_n=64, block_k=128, split_k=None, num_warps=4, num_stages=4, tma=False),
    ("matmul", 2048, 8192, 32): dict(block_n=64, block_k=128, split_k=4, num_warps=4, num_stages=5, tma=False),
    ("matmul", 2048, 8192, 64): dict(block_n=64, block_k=128, split_k=4, num_warps=4, num_stages=5, tma=False),
    ("qkv_rotary", 3072, 2048, 32): dict(block_p=32, block_k=128, split_k=2, num_warps=4, num_stages=5),
    ("qkv_rotary", 3072, 2048, 64): dict(block_p=32, block_k=128, split_k=2, num_warps=4, num_stages=5),
}


def m_pad(rows: int) -> int:
    """The dot's N for ``rows`` rows: the next power of two, at least 32."""
    return max(32, triton.next_power_of_2(rows))


def medium_config(kind: str, n: int, k: int, rows: int) -> dict | None:
    """The config of a ``kind`` ("matmul", "gate_up", "qkv_rotary") launch on a weight
    [n, k] and ``rows`` rows; None where that shape goes to cuBLAS."""
    return TUNED_CONFIGS.get((kind, n, k, m_pad(rows)), DEFAULT_CONFIGS[kind])


@triton.jit
def _medium_matmul_kernel(x_ptr, w, out_ptr, workspace_ptr, counters_ptr, M, N, K, K_PER_SPLIT,
                          stride_x, stride_w, stride_out, positions_ptr, cos_ptr, sin_ptr,
                          key_cache_ptr, value_cache_ptr, slot_mapping_ptr, num_slots,
                          stride_c_block, stride_c_slot, stride_c_head, num_q_heads,
                          num_kv_heads, parts_ptr, num_parts, eps, DOT_PRECISION: tl.constexpr,
                          M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          HALVES: tl.constexpr, SPLIT_K: tl.constexpr, TMA: tl.constexpr,
                          PDL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                          ADD_RESIDUAL: tl.constexpr, P_PAD: tl.constexpr):
    """Program (j, s): outputs n in [j * BLOCK_N, (j + 1) * BLOCK_N) of every
    row, over K columns [s * K_PER_SPLIT, (s + 1) * K_PER_SPLIT). It reads
    weight rows h * N + n for h < HALVES (HALVES = 2: gate and up rows of
    a weight of 2N rows); ``w`` is the weight's pointer, or with TMA its
    [HALVES, N, K] descriptor.

    HEAD_DIM > 0: the qkv + rotary epilogue (HALVES = 2, pointer tiles). An
    output n is then the rotary pair p = n % HALF of head n // HALF (HALF =
    HEAD_DIM / 2, N = heads * HALF), and half h reads weight row
    head * HEAD_DIM + h * HALF + p: the program's BLOCK_N pairs lie in one
    head, since BLOCK_N divides HALF. The rotary arguments (positions ..
    num_kv_heads, BLOCK_SIZE) are those of ``rotate_and_store_pairs``; the
    other epilogues take them as None.

    ADD_RESIDUAL (the plain epilogue only): out is the residual, out[m, n]
    += the sum, and ``parts_ptr`` [M, column groups] gets the new rows'
    sums of squares (``add_residual_and_store_parts``). P_PAD > 0 (NORM;
    the gate/up and qkv + rotary epilogues): the sums of row m are first
    scaled by its rstd from ``parts_ptr`` [M, num_parts] (``rstd_of_rows``).
    Arguments a launch's modes do not use are None."""
    NORM: tl.constexpr = P_PAD > 0
    wait_for_previous_kernel(PDL, LET_NEXT_START=not (ADD_RESIDUAL or NORM))
    W_ROWS: tl.constexpr = HALVES * BLOCK_N
    group = tl.program_id(0)
    n0 = group * BLOCK_N
    tile_rows = tl.arange(0, W_ROWS)
    cols = n0 + tile_rows % BLOCK_N
    if HEAD_DIM == 0:
        w_rows = ((tile_rows // BLOCK_N) * N + cols).to(tl.int64) * stride_w
    else:  # past n0's head: the hi halves of the heads before it, HALF rows each
        HALF: tl.constexpr = HEAD_DIM // 2
        head = n0 // HALF
        w_rows = ((tile_rows // BLOCK_N + head) * HALF + cols).to(tl.int64) * stride_w
    rows = tl.arange(0, M_PAD)
    row_mask = rows < M
    k_lo, k_hi = split_k_bounds(K, K_PER_SPLIT, SPLIT_K)
    acc = tl.zeros([W_ROWS, M_PAD], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :],
                    mask=row_mask[:, None] & (ks[None, :] < k_hi), other=0.0)
        if TMA:
            w_tile = tl.reshape(w.load([0, n0, k0]), [W_ROWS, BLOCK_K])
        else:
            w_tile = tl.load(w + w_rows[:, None] + ks[None, :],
                             mask=(cols < N)[:, None] & (ks[None, :] < k_hi), other=0.0)
        acc += tl.dot(w_tile, tl.trans(x), input_precision=DOT_PRECISION)
    if (ADD_RESIDUAL or NORM) and SPLIT_K == 1:
        let_next_kernel_start(PDL)
    if SPLIT_K > 1:
        PART: tl.constexpr = W_ROWS * M_PAD
        offs = tile_rows[:, None] * M_PAD + rows[None, :]
        parts = workspace_ptr + group.to(tl.int64) * (SPLIT_K * PART)
        tl.store(parts + tl.program_id(1) * PART + offs, acc)
        if not take_ticket(counters_ptr + group, SPLIT_K):
            return
        acc = sum_split_parts(parts, offs, PART, SPLIT_K)
    if NORM:
        acc *= rstd_of_rows(parts_ptr, rows, row_mask, num_parts, K, eps, P_PAD)[None, :]
    dtype = out_ptr.dtype.element_ty
    out_cols = n0 + tl.arange(0, BLOCK_N)
    if HEAD_DIM > 0:
        lo, hi = _split_halves(acc, BLOCK_N, M_PAD)
        rotate_and_store_pairs(lo, hi, head, out_cols - head * HALF, rows, row_mask,
                               positions_ptr, cos_ptr, sin_ptr, out_ptr, stride_out,
                               key_cache_ptr, value_cache_ptr, slot_mapping_ptr, num_slots,
                               stride_c_block, stride_c_slot, stride_c_head, num_q_heads,
                               num_kv_heads, HEAD_DIM, BLOCK_SIZE, ROW_AXIS=1)
    elif ADD_RESIDUAL:
        add_residual_and_store_parts(acc, out_ptr, stride_out, parts_ptr, rows, row_mask,
                                     out_cols, out_cols < N, ROW_AXIS=1)
    else:
        if HALVES == 2:
            gate, up = _split_halves(acc, BLOCK_N, M_PAD)
            out = silu_mul_rounded(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32),
                                   dtype)
        else:
            out = acc.to(dtype)
        tl.store(out_ptr + rows[None, :] * stride_out + out_cols[:, None], out,
                 mask=(out_cols < N)[:, None] & row_mask[None, :])


@triton.jit
def _split_halves(acc, BLOCK_N: tl.constexpr, M_PAD: tl.constexpr):
    """acc [2 * BLOCK_N, M_PAD] -> its first and second BLOCK_N rows."""
    return tl.split(tl.permute(tl.reshape(acc, [2, BLOCK_N, M_PAD]), (1, 2, 0)))


def medium_inputs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """What the medium kernels need of ``x @ weight.T``: half precision,
    MEDIUM_MIN_ROWS..MEDIUM_MAX_ROWS rows, unit last strides."""
    return dot_inputs(x, weight, MEDIUM_MIN_ROWS, MEDIUM_MAX_ROWS)


def uses_medium_matmul(x: torch.Tensor, weight: torch.Tensor, kind: str = "matmul") -> bool:
    """Whether the runner takes the medium ``kind`` kernel for ``x`` and
    ``weight`` (asked on CUDA only): the switch is on, the inputs fit
    (``medium_inputs``) and the shape is not tuned to cuBLAS."""
    return (MEDIUM_MATMUL_ENABLED and medium_inputs(x, weight)
            and medium_config(kind, *weight.shape, x.shape[0]) is not None)


def uses_medium_qkv_rotary(x: torch.Tensor, weight: torch.Tensor, head_dim: int) -> bool:
    """Whether ``qkv_rotary_write_kv`` takes the one-launch medium kernel:
    as ``uses_medium_matmul`` for kind "qkv_rotary", and the config's
    block_p pairs tile half a head."""
    if not (MEDIUM_MATMUL_ENABLED and medium_inputs(x, weight)):
        return False
    config = medium_config("qkv_rotary", *weight.shape, x.shape[0])
    return config is not None and head_dim % (2 * config["block_p"]) == 0


def medium_or_cublas(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T``: the medium kernel where ``uses_medium_matmul`` says
    so, cuBLAS (``F.linear``) elsewhere."""
    if uses_medium_matmul(x, weight):
        return medium_matmul(x, weight)
    return F.linear(x, weight)


def _check(kernel: str, x: torch.Tensor, w: torch.Tensor, halves: int) -> None:
    """One-line ValueErrors for inputs the kernel cannot take."""
    if x.shape[0] > MEDIUM_MAX_ROWS:
        raise ValueError(f"{kernel} takes at most {MEDIUM_MAX_ROWS} rows, got {x.shape[0]}")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or w.shape[0] % halves:
        raise ValueError(f"{kernel}: input {tuple(x.shape)} does not fit weight {tuple(w.shape)}")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError(f"{kernel} needs unit last strides")


# The kernel's rotary arguments in the plain and gate/up launches.
NO_ROTARY = dict(positions_ptr=None, cos_ptr=None, sin_ptr=None, key_cache_ptr=None,
                 value_cache_ptr=None, slot_mapping_ptr=None, num_slots=None,
                 stride_c_block=None, stride_c_slot=None, stride_c_head=None, num_q_heads=None,
                 num_kv_heads=None, HEAD_DIM=0, BLOCK_SIZE=None)


# The kernel's norm arguments in the plain launch (neither mode).
NO_NORM_MODES = dict(NO_NORM, ADD_RESIDUAL=False)


def _launch(x: torch.Tensor, w: torch.Tensor, halves: int, block_n: int, block_k: int,
            split_k: int | None, num_warps: int, num_stages: int, tma: bool,
            out: torch.Tensor | None = None, rotary: dict = NO_ROTARY,
            norm: dict = NO_NORM_MODES) -> torch.Tensor:
    """out [M, N] of weight rows h * N + n (h < halves) for each output n;
    with ``rotary`` (the kernel's rotary arguments) the given q output;
    ``norm``: the kernel's arguments of the norm modes."""
    m, k = x.shape
    n = w.shape[0] // halves
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    pad = m_pad(m)
    programs = triton.cdiv(n, block_n)
    if split_k is None:
        split_k = choose_split_k(programs, k, block_k, num_sms(x.device))
    workspace, counters = split_k_buffers(split_k, programs, halves * block_n * pad, x.device)
    weight = w
    if tma:
        if (w.stride(0) * w.element_size()) % 16 or w.data_ptr() % 16:
            raise ValueError("medium kernels take TMA weight tiles only from 16-byte aligned rows")
        weight = TensorDescriptor(w, [halves, n, k], [n * w.stride(0), w.stride(0), 1],
                                  [halves, block_n, block_k])
    _medium_matmul_kernel[(programs, split_k)](
        x, weight, out, workspace, counters, m, n, k, split_k_range(k, block_k, split_k),
        x.stride(0), w.stride(0), out.stride(0),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", M_PAD=pad,
        BLOCK_N=block_n, BLOCK_K=block_k, HALVES=halves, SPLIT_K=split_k, TMA=tma,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(x.device), **rotary, **norm)
    return out


def medium_matmul(x: torch.Tensor, w: torch.Tensor, *, block_n: int | None = None,
                  block_k: int | None = None, split_k: int | None = None,
                  num_warps: int | None = None, num_stages: int | None = None,
                  tma: bool | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K].T for M <= MEDIUM_MAX_ROWS rows, unit last strides
    (the kernel runs at any row count up to that; the runner sends it
    17..64). Arguments left None come from ``medium_config``; ``split_k``
    None there picks ``choose_split_k``. ``tma`` needs 16-byte aligned
    weight rows."""
    _check("medium_matmul", x, w, 1)
    return _launch(x, w, 1, **_config("matmul", w, x.shape[0], locals()))


def medium_matmul_add(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, *,
                      block_n: int | None = None, block_k: int | None = None,
                      split_k: int | None = None, num_warps: int | None = None,
                      num_stages: int | None = None, tma: bool | None = None) -> torch.Tensor:
    """``row_parallel_matmul_add_ref`` in one launch: residual [M, N] += x [M, K]
    @ w [N, K].T in place, rounded as the unfused pair rounds; returns the
    new residual's parts, float32 [M, cdiv(N, block_n)] (part j of a row:
    its squares summed over columns j * block_n on). The config is the
    plain kind's ("matmul"); arguments as ``medium_matmul``'s."""
    _check("medium_matmul_add", x, w, 1)
    check_residual("medium_matmul_add", x, w.shape[0], residual)
    config = _config("matmul", w, x.shape[0], locals())
    parts = new_parts(x.shape[0], triton.cdiv(w.shape[0], config["block_n"]), x.device)
    norm = dict(NO_NORM, parts_ptr=parts, ADD_RESIDUAL=True)
    _launch(x, w, 1, **config, out=residual, norm=norm)
    return parts


def medium_gate_up_silu(x: torch.Tensor, w: torch.Tensor, *, block_n: int | None = None,
                        block_k: int | None = None, split_k: int | None = None,
                        num_warps: int | None = None, num_stages: int | None = None,
                        tma: bool | None = None, parts: torch.Tensor | None = None,
                        eps: float = 0.0) -> torch.Tensor:
    """x [M, K] and w [2I, K] (gate rows, then up rows) -> silu(x @ gate.T) *
    (x @ up.T), [M, I], rounded as the projection and ``silu_mul_triton``
    round; M <= MEDIUM_MAX_ROWS. Arguments as ``medium_matmul``'s. With
    ``parts`` (float32 [M, P], a producer's) x is the raw residual:
    ``gate_up_silu_ref(x, w, parts, eps)``."""
    _check("medium_gate_up_silu", x, w, 2)
    norm = dict(norm_args("medium_gate_up_silu", parts, eps, x.shape[0]), ADD_RESIDUAL=False)
    return _launch(x, w, 2, **_config("gate_up", w, x.shape[0], locals()), norm=norm)


def medium_qkv_rotary_write_kv(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor,
                               cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                               slot_mapping: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                               *, block_p: int | None = None, block_k: int | None = None,
                               split_k: int | None = None, num_warps: int | None = None,
                               num_stages: int | None = None, parts: torch.Tensor | None = None,
                               eps: float = 0.0) -> torch.Tensor:
    """``qkv_rotary_write_kv_ref`` in one launch: x [M, K], weight
    [(Hq + 2 Hkv) D, K] (q rows, k rows, v rows) -> rotated q [M, Hq, D];
    rotated k and v stored at ``slot_mapping`` in ``kv_cache``
    [2, blocks, block_size, Hkv, D]. M <= MEDIUM_MAX_ROWS, unit last
    strides. A program computes ``block_p`` rotary pairs of one head
    (2 * block_p weight rows); arguments left None come from
    ``medium_config`` ("qkv_rotary"). With ``parts`` (float32 [M, P], a
    producer's) x is the raw residual, as in the reference."""
    _check("medium_qkv_rotary_write_kv", x, weight, 2)
    norm = dict(norm_args("medium_qkv_rotary_write_kv", parts, eps, x.shape[0]),
                ADD_RESIDUAL=False)
    config = _config("qkv_rotary", weight, x.shape[0], locals())
    head_dim = kv_cache.shape[-1]
    check_qkv_rotary("medium_qkv_rotary_write_kv", x, weight, kv_cache, num_q_heads,
                     num_kv_heads, config["block_p"])
    q = torch.empty(x.shape[0], num_q_heads, head_dim, dtype=x.dtype, device=x.device)
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    rotary = dict(positions_ptr=positions, cos_ptr=cos, sin_ptr=sin, key_cache_ptr=key_cache,
                  value_cache_ptr=value_cache, slot_mapping_ptr=slot_mapping,
                  num_slots=slot_mapping.shape[0], stride_c_block=key_cache.stride(0),
                  stride_c_slot=key_cache.stride(1), stride_c_head=key_cache.stride(2),
                  num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, HEAD_DIM=head_dim,
                  BLOCK_SIZE=key_cache.shape[1])
    return _launch(x, weight, 2, config.pop("block_p"), **config, tma=False, out=q,
                   rotary=rotary, norm=norm)


def _config(kind: str, w: torch.Tensor, rows: int, given: dict) -> dict:
    """The launch config: the caller's arguments that are not None over the
    shape's (``medium_config``; ``DEFAULT_CONFIGS`` where it is tuned to
    cuBLAS, since the caller asked for this kernel)."""
    config = dict(medium_config(kind, *w.shape, rows) or DEFAULT_CONFIGS[kind])
    config.update({name: given[name] for name in config if given.get(name) is not None})
    return config
