"""All-reduce over peer GPU memory for the ranks of one host, fused with RMSNorm.

Decode steps all-reduce a few rows of ``hidden`` values twice per layer; a
ring all-reduce through NCCL spends most of its time on protocol for such
messages. Here every rank owns one buffer in torch's symmetric memory (mapped
into every peer's address space once, at start-up), and one kernel launch:

1. pushes this rank's rows into its slot of every rank's buffer (stores over
   NVLink: one one-way trip; no flags, no fences),
2. polls its own buffer until every element of every slot is no longer the
   "empty" pattern (all-ones bits: a NaN; a message value with that pattern
   is sent as the canonical NaN instead, so it stays a NaN),
3. sums the slots **in rank order** in float32, and empties them again,
   so every rank rounds the same sum the same way: the ranks' results are
   equal bit for bit (each rank samples from its own logits, so a one-ulp
   difference would let the ranks' token streams diverge),
4. optionally adds the residual and applies RMSNorm, writing the new
   residual in place: the decoder's "all-reduce, add, norm" in one launch.

Invariants that make one barrier per call enough:

- The epoch counts calls and lives in device memory, advanced by the kernel
  itself, so a captured CUDA graph replays correctly. Every rank runs the
  same launches with the same grid (the ranks execute the same plan), and
  program p's rows are the same on every rank.
- Data is double-buffered by epoch parity: a peer can push call e+1 while
  this rank still reads call e, but not call e+2: the peer's call e+1 waits
  for this rank's push of e+1, which starts only after this rank's call e
  (its reads and its emptying of the slots) finished.
- Offsets are 32-bit: a message is at most MAX_BYTES.

Messages the buffer cannot hold, tensors off CUDA and groups the symmetric
memory cannot map fall back to NCCL (``TensorParallelGroup`` decides).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

# Programs of one call; each owns rows pid, pid + programs, ... and one flag per rank.
MAX_PROGRAMS = 32
# Bytes of one rank's message: the largest the one-shot path takes. Above it
# NCCL's bandwidth-optimal algorithms win.
MAX_BYTES = 1 << 20

# The byte an empty slot is filled with: all-ones is a NaN in every float type.
EMPTY_BYTE = 0xFF


@triton.jit
def _peer(buffer_ptrs, rank, ty: tl.constexpr):
    """Rank ``rank``'s symmetric buffer as a pointer to ``ty``."""
    return tl.load(buffer_ptrs + rank).to(tl.pointer_type(ty))


@triton.jit
def _all_reduce_rows_kernel(
    x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, out_ptr, out_stride,
    buffer_ptrs, epochs_ptr, rank, n_rows, n_cols, eps, rank_stride,
    WORLD: tl.constexpr, MAX_PROGRAMS: tl.constexpr, FUSE_NORM: tl.constexpr,
    BITS: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = x_ptr.dtype.element_ty
    bits_ty = tl.int16 if BITS == 16 else tl.int32

    # Every call advances all MAX_PROGRAMS counters once (program pid those
    # congruent to it), so they stay equal: the epoch counts calls, whatever
    # the grid, and its parity picks the half of the buffer this call uses.
    epoch = tl.load(epochs_ptr + pid) + 1
    for j in range(pid, MAX_PROGRAMS, programs):
        tl.store(epochs_ptr + j, epoch)
    half = (epoch % 2) * WORLD * rank_stride

    # 1. push this rank's rows into slot ``rank`` of every rank's buffer; a
    #    value that happens to be the "empty" pattern travels as another NaN
    for row in range(pid, n_rows, programs):
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask)
        x_bits = x.to(bits_ty, bitcast=True)
        x = tl.where(x_bits == -1, float("nan"), x).to(dtype)
        at = half + rank * rank_stride + row * n_cols + cols
        for p in tl.static_range(WORLD):
            tl.store(_peer(buffer_ptrs, p, dtype) + at, x, mask=mask)

    # 2. for each row, wait until every slot is filled, sum in rank order in
    #    float32, and empty the slots again for the call after next
    own = _peer(buffer_ptrs, rank, dtype)
    own_bits = _peer(buffer_ptrs, rank, bits_ty)
    for row in range(pid, n_rows, programs):
        offset = half + row * n_cols + cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(WORLD):
            ptrs = own + p * rank_stride + offset
            part = tl.load(ptrs, mask=mask, other=0.0, volatile=True)
            empty = tl.sum(((part.to(bits_ty, bitcast=True) == -1) & mask).to(tl.int32), axis=0)
            while empty > 0:
                part = tl.load(ptrs, mask=mask, other=0.0, volatile=True)
                empty = tl.sum(((part.to(bits_ty, bitcast=True) == -1) & mask).to(tl.int32),
                               axis=0)
            acc += part.to(tl.float32)
        for p in tl.static_range(WORLD):
            tl.store(own_bits + p * rank_stride + offset, tl.full([BLOCK], -1, bits_ty), mask=mask)
        total = acc.to(dtype)

        # 3. optionally: residual add and RMSNorm (numerics of rms_norm.py)
        if FUSE_NORM:
            r_ptrs = residual_ptr + row * residual_stride + cols
            r = tl.load(r_ptrs, mask=mask, other=0.0)
            total = (total.to(tl.float32) + r.to(tl.float32)).to(dtype)
            tl.store(r_ptrs, total, mask=mask)
            hf = total.to(tl.float32)
            mean_sq = tl.sum(hf * hf, axis=0) / n_cols
            normed = (hf * tl.rsqrt(mean_sq + eps)).to(dtype)
            w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
            total = (w.to(tl.float32) * normed.to(tl.float32)).to(dtype)
        tl.store(out_ptr + row * out_stride + cols, total, mask=mask)


class PeerBuffers:
    """Each rank's symmetric buffer: [half 0: one slot per rank | half 1: same].

    ``pointers[p]`` is rank p's buffer base as seen from this process; slot q
    of a half holds rank q's message of a call. An empty slot holds all-ones
    bytes (a NaN pattern no message carries). Built over CUDA symmetric
    memory by :meth:`create`; tests build it over plain tensors.
    """

    def __init__(self, pointers: torch.Tensor, rank: int, world: int,
                 max_bytes: int = MAX_BYTES, max_programs: int = MAX_PROGRAMS) -> None:
        self.pointers = pointers
        self.rank = rank
        self.world = world
        self.max_bytes = max_bytes
        self.max_programs = max_programs
        self.epochs = torch.zeros(max_programs, dtype=torch.int64, device=pointers.device)

    @staticmethod
    def buffer_bytes(world: int, max_bytes: int = MAX_BYTES) -> int:
        return 2 * world * max_bytes

    @classmethod
    def create(cls, device: torch.device, max_bytes: int = MAX_BYTES) -> PeerBuffers:
        """Allocate and exchange the buffers of the default group (a collective)."""
        import torch.distributed._symmetric_memory as symm_mem

        rank, world = dist.get_rank(), dist.get_world_size()
        buffer = symm_mem.empty(cls.buffer_bytes(world, max_bytes), dtype=torch.uint8,
                                device=device)
        buffer.fill_(EMPTY_BYTE)
        handle = symm_mem.rendezvous(buffer, dist.group.WORLD.group_name)
        pointers = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device)
        torch.cuda.synchronize(device)
        dist.barrier()
        peer = cls(pointers, rank, world, max_bytes)
        peer._keep_alive = (buffer, handle)
        return peer

    def takes(self, x: torch.Tensor) -> bool:
        """Whether ``x`` (rows x hidden, unit column stride) fits the one-shot path."""
        return (x.dim() == 2 and x.stride(-1) == 1 and x.shape[0] > 0
                and x.numel() * x.element_size() <= self.max_bytes
                and x.dtype in (torch.bfloat16, torch.float16, torch.float32))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The rank-ordered sum of every rank's ``x``, as a new tensor."""
        out = torch.empty_like(x)
        self._launch(x, out, None, None, 0.0)
        return out

    def all_reduce_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor,
                                weight: torch.Tensor, eps: float):
        """(norm(sum(x) + residual), sum(x) + residual); the second is written into ``residual``."""
        out = torch.empty_like(x)
        self._launch(x, out, residual, weight, eps)
        return out, residual

    def _launch(self, x, out, residual, weight, eps) -> None:
        rows, n_cols = x.shape
        fuse = residual is not None
        block = triton.next_power_of_2(n_cols)
        _all_reduce_rows_kernel[(min(rows, self.max_programs),)](
            x, x.stride(0), residual if fuse else x, residual.stride(0) if fuse else 0,
            weight if fuse else x, out, out.stride(0),
            self.pointers, self.epochs, self.rank, rows, n_cols, eps,
            self.max_bytes // x.element_size(),
            WORLD=self.world, MAX_PROGRAMS=self.max_programs, FUSE_NORM=fuse,
            BITS=8 * x.element_size(), BLOCK=block, num_warps=min(16, max(1, block // 256)),
        )
