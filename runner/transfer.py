"""Host/device transfer: pinned staging, UVA views and asynchronous copies.

Every path that moves data between the host and the runner's device goes
through a ``HostTransfer`` (synchronous copies, for a CPU device) or a
``PinnedTransfer`` (CUDA); ``runner.ops`` picks the class once from the
device. Nothing here waits for the device on the CUDA path:

- ``copy_into`` (the step's one input copy) goes through a ring of pinned
  staging buffers (``PinnedRing``) with ``non_blocking=True``. A buffer must not be rewritten
  before the copy that reads it has run, so each remembers an event recorded
  after its copy. The host runs at most a couple of steps ahead of the device
  (the engine keeps at most two steps in flight), so with a ring of
  ``RING_SIZE`` the event has always passed when a buffer comes round again;
  ``event.synchronize()`` is a guard that never waits in practice.
- ``upload`` (staged writes) and ``copy_into_side`` stage their arrays in
  rings of their own, the same way. Pinning fresh memory on every
  call costs far more host time than the copy itself (torch's pinned
  allocator), and a step pays it on its critical path.
- ``copy_into_side`` (a step's grammar bitmask) copies into persistent
  device buffers on a side stream, so the copy overlaps the forward pass
  already queued; the main stream waits for it before its next work. The
  side stream first waits for the event that ``side_buffers_read``
  recorded after the last kernel that read those buffers, so they are
  never rewritten while still being read.
- ``to_host`` (sampled tokens) copies on a side stream that first waits for
  the main stream, into pinned memory, and records an event; waiting on that
  event is the only wait on the device in a step.
- ``device_tensor(..., uva=True)`` is a device view of pinned host memory
  (below), so a large table lives on the host and kernels read it over the bus.

UVA without a compiled extension: with unified virtual addressing (every
64-bit CUDA platform), memory from cudaHostAlloc, which PyTorch's pinned
allocator uses, is mapped into the device address space at the same address.
So the pinned tensor's data_ptr() is a valid device pointer; an object that
exposes it through ``__cuda_array_interface__`` is wrapped with
torch.as_tensor into a CUDA tensor that aliases the host tensor. The view
holds a reference to that object, and the object to the host tensor, so the
pinned memory lives as long as either tensor does. Why: the persistent
all_token_ids table is max_num_seqs x max_model_len int32, for example
1024 x 131072 x 4 B = 512 MiB, far too much device memory for data that a
step touches only a few rows of.

Caveat: if PYTORCH_CUDA_ALLOC_CONF sets pinned_use_cuda_host_register, pinned
memory is malloc + cudaHostRegister, and the device address equals the host
address only where the device reports canUseHostPointerForRegisteredMem (true
on current Linux x86-64 and Grace systems). The GPU test in
tests/runner/test_staged_write.py checks that a kernel sees host writes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

RING_SIZE = 8


def is_uva_available() -> bool:
    """True when a CUDA device is present and pinned memory can be allocated."""
    if not torch.cuda.is_available():
        return False
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError:
        return False
    return True


@functools.cache
def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype matching a numpy dtype (cached, as ``numpy_dtype``)."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype matching a torch dtype; ValueError when numpy has none.
    Cached: the staged writes ask it for every target of every step."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError as exc:
        raise ValueError(f"dtype {dtype} has no numpy equivalent") from exc


class _DeviceArray:
    """Exposes a pinned host tensor's memory as a CUDA array (interface v3)."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape),
            "typestr": numpy_dtype(host.dtype).str,
            "data": (host.data_ptr(), False),
            "strides": None,
            "version": 3,
        }


@dataclass(frozen=True)
class UvaTensor:
    """One block of pinned host memory seen twice: ``cpu`` (host) and ``gpu`` (device view).

    Writes through either are visible through the other once ordered: host
    writes before a kernel launch are seen by it; kernel writes are seen by the
    host after the stream is synchronized.
    """

    cpu: torch.Tensor
    gpu: torch.Tensor


def make_uva_tensor(shape: tuple[int, ...], dtype: torch.dtype,
                    index: int | None = None) -> UvaTensor:
    """Zero-filled pinned host tensor plus a view of it on CUDA device ``index``
    (None: the current device)."""
    if not is_uva_available():
        raise ValueError("UVA is not available (no CUDA device or no pinned memory)")
    index = torch.cuda.current_device() if index is None else index
    host = torch.zeros(shape, dtype=dtype, pin_memory=True)
    view = torch.as_tensor(_DeviceArray(host), device=torch.device("cuda", index))
    if view.data_ptr() != host.data_ptr():
        raise RuntimeError("the CUDA view of pinned memory is a copy, not an alias")
    return UvaTensor(cpu=host, gpu=view)


class PinnedRing:
    """``RING_SIZE`` persistent pinned buffers, used in turn, each grown (to
    a power of two) when a staging needs more. ``stage`` packs arrays into
    the next buffer at 64-byte offsets and returns pinned views of them;
    ``copied(stream)`` then records, on the stream that copies from them,
    the event the buffer's next use waits for (which has always passed by
    then: see the module docstring). ``reserve`` allocates every buffer up
    front, so that no step pays for pinning memory (far slower than the
    copy) on its critical path."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor | None] = [None] * RING_SIZE
        self.hosts: list[np.ndarray | None] = [None] * RING_SIZE  # numpy views of buffers
        self.events: list[torch.cuda.Event | None] = [None] * RING_SIZE
        self.next = 0

    def reserve(self, nbytes: int) -> None:
        """Grow every buffer to hold at least ``nbytes`` (0: nothing to do)."""
        for i in range(RING_SIZE if nbytes > 0 else 0):
            self._fit(i, nbytes)

    def _fit(self, i: int, nbytes: int) -> None:
        buf = self.buffers[i]
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(1 << max(nbytes - 1, 1).bit_length(), dtype=torch.uint8,
                              pin_memory=True)
            self.buffers[i], self.hosts[i] = buf, buf.numpy()

    def stage(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        offsets, total = [], 0
        for a in arrays:
            offsets.append(total)
            total += -(-a.nbytes // 64) * 64
        i = self.next
        if self.events[i] is not None:
            self.events[i].synchronize()
        self._fit(i, total)
        buf, host = self.buffers[i], self.hosts[i]
        views = []
        for a, offset in zip(arrays, offsets):
            host[offset: offset + a.nbytes] = a.reshape(-1).view(np.uint8)
            view = buf[offset: offset + a.nbytes]
            if a.dtype != np.uint8:
                view = view.view(torch_dtype(a.dtype))
            views.append(view if a.ndim == 1 else view.view(a.shape))
        return views

    def copied(self, stream: torch.cuda.Stream) -> None:
        # Each buffer keeps one event, recorded again at each use: ``stage``
        # has waited for its last record before the buffer was reused.
        event = self.events[self.next]
        if event is None:
            event = self.events[self.next] = torch.cuda.Event()
        event.record(stream)
        self.next = (self.next + 1) % RING_SIZE


class CopyDone:
    """A finished copy: ``synchronize()`` returns at once."""

    def synchronize(self) -> None:
        return None


class HostTransfer:
    """Transfers for a device that shares the host's memory: plain copies."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def device_tensor(self, shape: tuple[int, ...], dtype: torch.dtype,
                      uva: bool = False) -> torch.Tensor:
        """A zero-filled tensor kernels on the device can use (``uva`` asks for
        pinned host memory seen by the device, where the device has it)."""
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def copy_into(self, src: np.ndarray, dst: torch.Tensor) -> None:
        """Copy ``src`` into the first ``len(src)`` elements of ``dst`` (a
        read-only ``src``, such as a message's buffer, is copied first:
        torch shares numpy memory and may not be given read-only memory)."""
        dst[: src.shape[0]].copy_(torch.from_numpy(np.require(src, requirements="W")))

    def upload(self, *arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
        """Fresh arrays as device tensors (the arrays are not reused)."""
        return tuple(torch.from_numpy(a) for a in arrays)

    def reserve(self, upload_bytes: int = 0, copy_bytes: int = 0) -> None:
        """Make room up front for ``upload`` calls of ``upload_bytes`` and
        ``copy_into`` calls of ``copy_bytes`` (pinned staging where the
        device has it; nothing here)."""

    def copy_into_side(self, pairs: list[tuple[np.ndarray, torch.Tensor]]) -> None:
        """Copy each ``src`` into the first ``len(src)`` rows of its ``dst``,
        before any later work on the current stream."""
        for src, dst in pairs:
            self.copy_into(src, dst)

    def side_buffers_read(self) -> None:
        """The buffers ``copy_into_side`` wrote have been read by the work
        queued so far (nothing to order on a host device)."""

    def to_host(self, tensors: tuple[torch.Tensor, ...]):
        """Start copying ``tensors`` to the host: (host tensors, a CopyDone-like
        object whose ``synchronize()`` waits for the copy)."""
        return tuple(t.clone() for t in tensors), CopyDone()


class PinnedTransfer(HostTransfer):
    """Transfers for a CUDA device: pinned staging, UVA and asynchronous copies.

    The staging ring and the copy stream are made on first use, so an
    instance that only uploads holds no ring.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.copy_ring = PinnedRing()
        self.copy_stream: torch.cuda.Stream | None = None
        self.side_stream: torch.cuda.Stream | None = None
        self.side_read_event: torch.cuda.Event | None = None
        self.upload_ring = PinnedRing()
        self.side_ring = PinnedRing()

    def device_tensor(self, shape: tuple[int, ...], dtype: torch.dtype,
                      uva: bool = False) -> torch.Tensor:
        """With uva=True where UVA works: the CUDA view of pinned host memory.
        Otherwise ordinary device memory, the fallback that always works."""
        if uva and is_uva_available():
            return make_uva_tensor(shape, dtype, self.device.index).gpu
        return super().device_tensor(shape, dtype)

    def copy_into(self, src: np.ndarray, dst: torch.Tensor) -> None:
        (staged,) = self.copy_ring.stage([src])
        dst = dst if src.shape[0] == dst.shape[0] else dst[: src.shape[0]]
        dst.copy_(staged, non_blocking=True)
        self.copy_ring.copied(torch.cuda.current_stream())

    def reserve(self, upload_bytes: int = 0, copy_bytes: int = 0) -> None:
        self.upload_ring.reserve(upload_bytes)
        self.copy_ring.reserve(copy_bytes)

    def upload(self, *arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
        host = self.upload_ring.stage(list(arrays))
        dev = tuple(h.to(self.device, non_blocking=True) for h in host)
        self.upload_ring.copied(torch.cuda.current_stream())
        return dev

    def copy_into_side(self, pairs: list[tuple[np.ndarray, torch.Tensor]]) -> None:
        if self.side_stream is None:
            self.side_stream = torch.cuda.Stream(self.device)
        main_stream = torch.cuda.current_stream()
        host = self.side_ring.stage([src for src, _ in pairs])
        with torch.cuda.stream(self.side_stream):
            if self.side_read_event is not None:
                self.side_stream.wait_event(self.side_read_event)
            for src, (_, dst) in zip(host, pairs):
                dst[: src.shape[0]].copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.side_stream)
        main_stream.wait_event(done)
        self.side_ring.copied(self.side_stream)

    def side_buffers_read(self) -> None:
        self.side_read_event = torch.cuda.Event()
        self.side_read_event.record()

    def to_host(self, tensors: tuple[torch.Tensor, ...]):
        if self.copy_stream is None:
            self.copy_stream = torch.cuda.Stream(self.device)
        main_stream = torch.cuda.current_stream()
        host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors)
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_stream(main_stream)
            for src, dst in zip(tensors, host):
                dst.copy_(src, non_blocking=True)
                src.record_stream(self.copy_stream)
            event = torch.cuda.Event(blocking=True)
            event.record(self.copy_stream)
        return host, event
