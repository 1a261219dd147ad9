"""All-reduce over peer GPU memory for the ranks of one host, fused with RMSNorm.

Decode steps all-reduce a few rows of ``hidden`` values twice per layer; a
ring all-reduce through NCCL spends most of its time on protocol for such
messages. Here every rank owns one buffer in torch's symmetric memory (mapped
into every peer's address space once, at start-up), and one kernel launch:

1. copies this rank's rows into its own buffer,
2. tells every peer "row r of epoch e is written" (a flag in the peer's
   buffer, stored with release semantics at system scope) and waits until
   every peer said the same to it (acquire),
3. reads the rows of every rank **in rank order** and sums them in float32,
   so every rank rounds the same sum the same way: the ranks' results are
   equal bit for bit (each rank samples from its own logits, so a one-ulp
   difference would let the ranks' token streams diverge),
4. optionally adds the residual and applies RMSNorm, writing the new
   residual in place: the decoder's "all-reduce, add, norm" in one launch.

Invariants that make one barrier per call enough:

- Each program owns one row and keeps its own epoch counter in device memory
  (``epochs[row]``), incremented by the kernel itself, so a captured CUDA
  graph replays correctly. Every rank runs the same launches with the same
  grid (the ranks execute the same plan), so row r's epochs agree.
- Flags only grow; a waiter accepts ``flag >= epoch`` (a fast peer may have
  signalled the next epoch already).
- Data is double-buffered by epoch parity: a peer can write epoch e+1 while
  this rank still reads epoch e, but not epoch e+2, because that needs this
  rank's signal for e+1, which it sends only after it finished reading e.

Messages the buffer cannot hold, tensors off CUDA and groups the symmetric
memory cannot map fall back to NCCL (``TensorParallelGroup`` decides).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

# Rows one call may carry (one program each); flags take 8 bytes per row and rank.
MAX_ROWS = 512
# Bytes of one epoch parity's data region: the largest message the one-shot
# path takes. Above it NCCL's bandwidth-optimal algorithms win.
MAX_BYTES = 1 << 20

_FLAG_ALIGN = 256


@triton.jit
def _peer(buffer_ptrs, rank, ty: tl.constexpr):
    """Rank ``rank``'s symmetric buffer as a pointer to ``ty``."""
    return tl.load(buffer_ptrs + rank).to(tl.pointer_type(ty))


@triton.jit
def _all_reduce_rows_kernel(
    x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, out_ptr, out_stride,
    buffer_ptrs, epochs_ptr, rank, n_cols, eps, data_offset, parity_stride,
    WORLD: tl.constexpr, FUSE_NORM: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = x_ptr.dtype.element_ty

    epoch = tl.load(epochs_ptr + row) + 1
    tl.store(epochs_ptr + row, epoch)
    slot = data_offset + (epoch % 2) * parity_stride + row.to(tl.int64) * n_cols

    # 1. this rank's row into its own buffer
    x = tl.load(x_ptr + row.to(tl.int64) * x_stride + cols, mask=mask)
    tl.store(_peer(buffer_ptrs, rank, dtype) + slot + cols, x, mask=mask)
    tl.debug_barrier()

    # 2. signal every peer, then wait for every peer's signal
    flag = row * WORLD + rank
    for p in tl.static_range(WORLD):
        tl.atomic_xchg(_peer(buffer_ptrs, p, tl.int64) + flag, epoch, sem="release", scope="sys")
    own_flags = _peer(buffer_ptrs, rank, tl.int64) + row * WORLD
    for p in tl.static_range(WORLD):
        seen = tl.atomic_add(own_flags + p, 0, sem="acquire", scope="sys")
        while seen < epoch:
            seen = tl.atomic_add(own_flags + p, 0, sem="acquire", scope="sys")
    tl.debug_barrier()

    # 3. sum every rank's row, in rank order, in float32
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(WORLD):
        part = tl.load(_peer(buffer_ptrs, p, dtype) + slot + cols, mask=mask, other=0.0,
                       cache_modifier=".cg")
        acc += part.to(tl.float32)
    total = acc.to(dtype)

    # 4. optionally: residual add and RMSNorm (numerics of rms_norm.py)
    if FUSE_NORM:
        r_ptrs = residual_ptr + row.to(tl.int64) * residual_stride + cols
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        total = (total.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(r_ptrs, total, mask=mask)
        hf = total.to(tl.float32)
        mean_sq = tl.sum(hf * hf, axis=0) / n_cols
        normed = (hf * tl.rsqrt(mean_sq + eps)).to(dtype)
        w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
        total = (w.to(tl.float32) * normed.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, total, mask=mask)


class PeerBuffers:
    """Each rank's symmetric buffer, laid out as [flags | data parity 0 | data parity 1].

    ``pointers[p]`` is rank p's buffer base as seen from this process; the
    flags region holds one int64 per (row, signalling rank). Built over CUDA
    symmetric memory by :meth:`create`; tests build it over plain tensors.
    """

    def __init__(self, pointers: torch.Tensor, rank: int, world: int,
                 max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES) -> None:
        self.pointers = pointers
        self.rank = rank
        self.world = world
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.flag_bytes = layout_flag_bytes(max_rows, world)
        self.epochs = torch.zeros(max_rows, dtype=torch.int64, device=pointers.device)

    @classmethod
    def create(cls, device: torch.device, max_rows: int = MAX_ROWS,
               max_bytes: int = MAX_BYTES) -> PeerBuffers:
        """Allocate and exchange the buffers of the default group (a collective)."""
        import torch.distributed._symmetric_memory as symm_mem

        rank, world = dist.get_rank(), dist.get_world_size()
        flag_bytes = layout_flag_bytes(max_rows, world)
        buffer = symm_mem.empty(flag_bytes + 2 * max_bytes, dtype=torch.uint8, device=device)
        buffer.zero_()
        handle = symm_mem.rendezvous(buffer, dist.group.WORLD.group_name)
        pointers = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device)
        torch.cuda.synchronize(device)
        dist.barrier()
        peer = cls(pointers, rank, world, max_rows, max_bytes)
        peer._keep_alive = (buffer, handle)
        return peer

    def takes(self, x: torch.Tensor) -> bool:
        """Whether ``x`` (rows x hidden, unit column stride) fits the one-shot path."""
        return (x.dim() == 2 and x.stride(-1) == 1 and 0 < x.shape[0] <= self.max_rows
                and x.numel() * x.element_size() <= self.max_bytes
                and self.flag_bytes % x.element_size() == 0)

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
        size = x.element_size()
        fuse = residual is not None
        block = triton.next_power_of_2(n_cols)
        _all_reduce_rows_kernel[(rows,)](
            x, x.stride(0), residual if fuse else x, residual.stride(0) if fuse else 0,
            weight if fuse else x, out, out.stride(0),
            self.pointers, self.epochs, self.rank, n_cols, eps,
            self.flag_bytes // size, self.max_bytes // size,
            WORLD=self.world, FUSE_NORM=fuse, BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )


def layout_flag_bytes(max_rows: int, world: int) -> int:
    """Bytes of the flags region: one int64 per (row, rank), aligned for any data type."""
    raw = max_rows * world * 8
    return (raw + _FLAG_ALIGN - 1) // _FLAG_ALIGN * _FLAG_ALIGN
