"""All-reduce over peer GPU memory for the ranks of one host, fused with RMSNorm.

Decode steps all-reduce a few rows of ``hidden`` values twice per layer; a
ring all-reduce through NCCL spends most of its time on protocol for such
messages. Here every rank owns one buffer in torch's symmetric memory (mapped
into every peer's address space once, at start-up), and one kernel launch:

1. pushes this rank's rows into its slot of every rank's buffer (stores over
   NVLink: one one-way trip, where pulling a peer's rows would take two),
2. tells every peer "my rows of call e are there" (a flag in the peer's
   buffer, stored with release semantics at system scope) and waits until
   every peer said the same to it (acquire),
3. reads every rank's slot from its own buffer **in rank order** and sums
   them in float32,
   so every rank rounds the same sum the same way: the ranks' results are
   equal bit for bit (each rank samples from its own logits, so a one-ulp
   difference would let the ranks' token streams diverge),
4. optionally adds the residual and applies RMSNorm, writing the new
   residual in place: the decoder's "all-reduce, add, norm" in one launch.

Invariants that make one barrier per call enough:

- The epoch counts calls and lives in device memory, advanced by the kernel
  itself, so a captured CUDA graph replays correctly. Every rank runs the
  same launches with the same grid (the ranks execute the same plan), and
  program p's rows are the same on every rank, so a barrier per program is
  enough: it waits only for the peers' programs p, which pushed its rows.
- Flags only grow; a waiter accepts ``flag >= epoch`` (a fast peer may have
  signalled the next epoch already).
- Data is double-buffered by epoch parity: a peer can push call e+1 while
  this rank still reads call e, but not call e+2, because that needs this
  rank's signal for e+1, which it sends only after its call e finished.

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

_FLAG_ALIGN = 256


@triton.jit
def _peer(buffer_ptrs, rank, ty: tl.constexpr):
    """Rank ``rank``'s symmetric buffer as a pointer to ``ty``."""
    return tl.load(buffer_ptrs + rank).to(tl.pointer_type(ty))


@triton.jit
def _all_reduce_rows_kernel(
    x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, out_ptr, out_stride,
    buffer_ptrs, epochs_ptr, rank, n_rows, n_cols, eps, data_offset, rank_stride,
    WORLD: tl.constexpr, MAX_PROGRAMS: tl.constexpr, FUSE_NORM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = x_ptr.dtype.element_ty

    # Every call advances all MAX_PROGRAMS counters once (program pid those
    # congruent to it), so they stay equal: the epoch counts calls, whatever
    # the grid, and its parity picks the data half of this call.
    epoch = tl.load(epochs_ptr + pid) + 1
    for j in range(pid, MAX_PROGRAMS, programs):
        tl.store(epochs_ptr + j, epoch)
    parity_base = data_offset + (epoch % 2) * WORLD * rank_stride

    # 1. push this rank's rows into slot ``rank`` of every rank's buffer
    for row in range(pid, n_rows, programs):
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask)
        at = parity_base + rank * rank_stride + row * n_cols + cols
        for p in tl.static_range(WORLD):
            tl.store(_peer(buffer_ptrs, p, dtype) + at, x, mask=mask)
    tl.debug_barrier()

    # 2. signal every peer, then wait for every peer's signal
    for p in tl.static_range(WORLD):
        tl.atomic_xchg(_peer(buffer_ptrs, p, tl.int64) + pid * WORLD + rank, epoch,
                       sem="release", scope="sys")
    own_flags = _peer(buffer_ptrs, rank, tl.int64) + pid * WORLD
    for p in tl.static_range(WORLD):
        seen = tl.load(own_flags + p, volatile=True)
        while seen < epoch:
            seen = tl.load(own_flags + p, volatile=True)
        tl.atomic_add(own_flags + p, 0, sem="acquire", scope="sys")
    tl.debug_barrier()

    # 3. sum every rank's row from this rank's own buffer, in rank order, in float32
    own = _peer(buffer_ptrs, rank, dtype)
    for row in range(pid, n_rows, programs):
        offset = row * n_cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(WORLD):
            part = tl.load(own + parity_base + p * rank_stride + offset + cols, mask=mask,
                           other=0.0, cache_modifier=".cg")
            acc += part.to(tl.float32)
        total = acc.to(dtype)

        # 4. optionally: residual add and RMSNorm (numerics of rms_norm.py)
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
    """Each rank's symmetric buffer: [flags | parity 0: one slot per rank | parity 1: same].

    ``pointers[p]`` is rank p's buffer base as seen from this process. The
    flags region holds one int64 per (program, signalling rank); slot q of a
    parity holds rank q's message of that call. Built over CUDA symmetric
    memory by :meth:`create`; tests build it over plain tensors.
    """

    def __init__(self, pointers: torch.Tensor, rank: int, world: int,
                 max_bytes: int = MAX_BYTES, max_programs: int = MAX_PROGRAMS,
                 owner: object = None) -> None:
        self.pointers = pointers
        # What keeps the buffers mapped (the symmetric-memory tensor and handle).
        self.owner = owner
        self.rank = rank
        self.world = world
        self.max_bytes = max_bytes
        self.max_programs = max_programs
        self.flag_bytes = layout_flag_bytes(max_programs, world)
        self.epochs = torch.zeros(max_programs, dtype=torch.int64, device=pointers.device)

    @staticmethod
    def buffer_bytes(world: int, max_bytes: int = MAX_BYTES,
                     max_programs: int = MAX_PROGRAMS) -> int:
        return layout_flag_bytes(max_programs, world) + 2 * world * max_bytes

    @staticmethod
    def reachable(device: torch.device) -> bool:
        """Whether this rank's GPU can map the memory of every other rank's
        (NVLink or PCIe peer access), which the buffers need (a collective)."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        mine = torch.tensor([index], dtype=torch.int64, device=device)
        everyone = torch.empty(dist.get_world_size(), dtype=torch.int64, device=device)
        dist.all_gather_into_tensor(everyone, mine)
        return all(torch.cuda.can_device_access_peer(index, other)
                   for other in everyone.tolist() if other != index)

    @classmethod
    def create(cls, device: torch.device, max_bytes: int = MAX_BYTES) -> PeerBuffers:
        """Allocate and exchange the buffers of the default group (a collective)."""
        import torch.distributed._symmetric_memory as symm_mem

        rank, world = dist.get_rank(), dist.get_world_size()
        buffer = symm_mem.empty(cls.buffer_bytes(world, max_bytes), dtype=torch.uint8,
                                device=device)
        buffer.zero_()
        handle = symm_mem.rendezvous(buffer, dist.group.WORLD.group_name)
        pointers = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device)
        torch.cuda.synchronize(device)
        dist.barrier()
        return cls(pointers, rank, world, max_bytes, owner=(buffer, handle))

    def takes(self, x: torch.Tensor) -> bool:
        """Whether ``x`` (rows x hidden, unit column stride) fits the one-shot path."""
        return (x.dim() == 2 and x.stride(-1) == 1 and x.shape[0] > 0
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
        _all_reduce_rows_kernel[(min(rows, self.max_programs),)](
            x, x.stride(0), residual if fuse else x, residual.stride(0) if fuse else 0,
            weight if fuse else x, out, out.stride(0),
            self.pointers, self.epochs, self.rank, rows, n_cols, eps,
            self.flag_bytes // size, self.max_bytes // size,
            WORLD=self.world, MAX_PROGRAMS=self.max_programs, FUSE_NORM=fuse, BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )


def layout_flag_bytes(max_programs: int, world: int) -> int:
    """Bytes of the flags region: one int64 per (program, rank), aligned for any data type."""
    raw = max_programs * world * 8
    return (raw + _FLAG_ALIGN - 1) // _FLAG_ALIGN * _FLAG_ALIGN
