"""Pinned host memory that CUDA kernels read and write directly (UVA).

Why: the persistent all_token_ids table is max_num_seqs x max_model_len int32,
for example 1024 x 131072 x 4 B = 512 MiB, far too much GPU memory for data
that a step touches only a few rows of (the prompt tokens of prefilling
requests). It lives in pinned host memory instead, and the kernels read it
over the bus through a device view of the same memory.

How, without a compiled extension: with unified virtual addressing (every
64-bit CUDA platform), memory from cudaHostAlloc, which PyTorch's pinned
allocator uses, is mapped into the device address space at the same address.
So the pinned tensor's data_ptr() is a valid device pointer; an object that
exposes it through ``__cuda_array_interface__`` is wrapped with
torch.as_tensor into a CUDA tensor that aliases the host tensor. The view
holds a reference to that object, and the object to the host tensor, so the
pinned memory lives as long as either tensor does.

Caveat: if PYTORCH_CUDA_ALLOC_CONF sets pinned_use_cuda_host_register, pinned
memory is malloc + cudaHostRegister, and the device address equals the host
address only where the device reports canUseHostPointerForRegisteredMem (true
on current Linux x86-64 and Grace systems). The GPU test in
tests/test_staged_write.py checks that a kernel sees host writes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def is_uva_available() -> bool:
    """True when a CUDA device is present and pinned memory can be allocated."""
    if not torch.cuda.is_available():
        return False
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError:
        return False
    return True


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype matching a torch dtype; ValueError when numpy has none."""
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


def make_uva_tensor(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cuda"
) -> UvaTensor:
    """Zero-filled pinned host tensor plus a CUDA view of it on ``device``."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"UVA needs a CUDA device, got {device}")
    if not is_uva_available():
        raise ValueError("UVA is not available (no CUDA device or no pinned memory)")
    index = device.index if device.index is not None else torch.cuda.current_device()
    host = torch.zeros(shape, dtype=dtype, pin_memory=True)
    view = torch.as_tensor(_DeviceArray(host), device=torch.device("cuda", index))
    if view.data_ptr() != host.data_ptr():
        raise RuntimeError("the CUDA view of pinned memory is a copy, not an alias")
    return UvaTensor(cpu=host, gpu=view)


def device_visible_tensor(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, uva: bool
) -> torch.Tensor:
    """A zero-filled tensor kernels on ``device`` can use.

    With uva=True on a CUDA device where UVA works: the CUDA view of pinned host
    memory. Otherwise (uva=False, CPU device, or no UVA): ordinary memory on
    ``device``, the fallback that always works.
    """
    device = torch.device(device)
    if uva and device.type == "cuda" and is_uva_available():
        return make_uva_tensor(shape, dtype, device).gpu
    return torch.zeros(shape, dtype=dtype, device=device)
