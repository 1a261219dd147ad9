"""``triton`` and ``triton.language`` for the kernel modules, loaded only
where kernels may run.

Triton kernels run on CUDA, or on the CPU under ``TRITON_INTERPRET=1`` (the
tests' oracles). Anywhere else the runner uses torch references and never
launches a kernel, so Triton is neither imported (it is slow to import) nor
required to be installed. There the kernel modules get stand-ins: a kernel
can still be defined (decorated, annotated), and launching one raises
``RuntimeError`` saying why. The host helpers ``cdiv`` and
``next_power_of_2`` work either way.
"""

from __future__ import annotations

import os

import torch


def triton_wanted() -> bool:
    """Kernels may run in this process: CUDA is present, or the tests
    interpret kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()


class _NotLoaded:
    """Any attribute of ``triton`` or ``triton.language`` while Triton is not
    loaded: usable in kernel definitions, never launchable."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> _NotLoaded:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _NotLoaded(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if self._name == "triton.jit":  # @triton.jit or @triton.jit(...)
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return _UnloadedKernel(args[0].__name__)
            return lambda fn: _UnloadedKernel(fn.__name__)
        raise RuntimeError(f"{self._name} needs Triton, which this process does not load: "
                           "kernels run on CUDA or with TRITON_INTERPRET=1")

    def __getitem__(self, item):
        return self


class _UnloadedKernel:
    """A kernel defined while Triton is not loaded."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):
        raise RuntimeError(f"kernel {self.name} needs Triton, which this process does not "
                           "load: kernels run on CUDA or with TRITON_INTERPRET=1")


class _HostHelpers(_NotLoaded):
    """``triton`` without Triton: its pure host helpers still work."""

    @staticmethod
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    @staticmethod
    def next_power_of_2(n: int) -> int:
        return 1 if n <= 1 else 1 << (n - 1).bit_length()


if triton_wanted():
    import triton
    import triton.language as tl
else:
    triton = _HostHelpers("triton")
    tl = _NotLoaded("triton.language")

__all__ = ["tl", "triton", "triton_wanted"]
