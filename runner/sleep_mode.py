"""Sleep mode: a runner's device memory given back between steps, and taken again.

vLLM's levels and tags (``LLM.sleep`` / ``LLM.wake_up``):

- level 1: the weights (parameters and buffers) are copied to host memory
  (pinned where the device is not host memory) and their device storage
  freed; the KV cache is freed without a copy (its contents are forgotten).
- level 2: the KV cache and the parameters are freed without a copy; only
  the buffers (rotary tables, which no checkpoint holds) are kept on the
  host. Waking the weights reads the parameters from the checkpoint again
  (``ModelRunner._reload_weights``), as the model was loaded at start.
- ``wake(tags)``: "weights" and "kv_cache" come back separately (None:
  both), so a caller can restore the weights before the cache takes its
  memory again.

Freeing is ``untyped_storage().resize_(0)`` on each distinct storage: every
``Parameter``, buffer and view that the model, its layers and the runner
hold stays the same object, and a restore resizes the same storage back and
copies its bytes in. The device addresses change, so whatever captured them
(CUDA graphs) is dropped before sleeping and captured again after the last
tag wakes (``ModelRunner``). Sleeping and waking happen between steps only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ipc.config import SLEEP_LEVELS as LEVELS
from ipc.config import SLEEP_TAGS as TAGS

WEIGHTS, KV_CACHE = TAGS


class Storages:
    """The distinct storages under some tensors (shared ones once: a tied
    LM head, views), freed and restored in place. ``host`` holds the bytes
    of each offloaded storage while it is freed (None: discarded)."""

    def __init__(self, tensors: Iterable[torch.Tensor], exclude: Storages | None = None):
        seen = set() if exclude is None else {s.data_ptr() for s in exclude.storages}
        self.storages: list[torch.UntypedStorage] = []
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                self.storages.append(storage)
        self.sizes = [s.nbytes() for s in self.storages]
        self.host: list[torch.Tensor] | None = None
        self.pinned = False  # the host copies are page-locked

    @property
    def nbytes(self) -> int:
        """Bytes the storages hold on their device now (0 while freed)."""
        return sum(s.nbytes() for s in self.storages)

    def offload(self, pin: bool) -> None:
        """Copy every storage to host memory (``pin``: page-locked), then free it."""
        self.host, self.pinned = [], pin
        for storage, size in zip(self.storages, self.sizes):
            copy = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
            copy.untyped_storage().copy_(storage)
            self.host.append(copy)
        self.discard(keep_host=True)

    def discard(self, keep_host: bool = False) -> None:
        """Free every storage; their contents are forgotten unless offloaded."""
        if not keep_host:
            self.host = None
        for storage in self.storages:
            storage.resize_(0)

    def restore(self) -> None:
        """Give every storage its size back, with its offloaded bytes if it
        has any (else uninitialized, for its owner to fill)."""
        for storage, size in zip(self.storages, self.sizes):
            storage.resize_(size)
        if self.host is not None:
            for storage, copy in zip(self.storages, self.host):
                storage.copy_(copy.untyped_storage())
        self.host = None
        if self.pinned:
            _release_cached_pinned_memory()
            self.pinned = False


def _release_cached_pinned_memory() -> None:
    """Free the page-locked host blocks torch caches once their tensors are
    gone: its pinned allocator keeps every freed block for reuse, so the
    host copies of a woken model would stay pinned (as much host memory as
    the weights, for good). A torch built without CUDA has no such cache."""
    release = getattr(torch._C, "_host_emptyCache", None)
    if release is not None:
        release()


class SleepingMemory:
    """What one sleep freed: the model's parameters and buffers, and the KV
    cache; ``asleep`` the tags not woken yet. ``reload_weights`` refills
    the parameters from the checkpoint (level 2's weights)."""

    def __init__(self, level: int, models: list[torch.nn.Module],
                 kv_caches: list[torch.Tensor], pin: bool,
                 reload_weights: Callable[[], None]):
        if level not in LEVELS:
            raise ValueError(f"sleep level must be one of {LEVELS}, got {level!r}")
        self.level = level
        self.params = Storages(p for m in models for p in m.parameters())
        self.buffers = Storages((b for m in models for b in m.buffers()), exclude=self.params)
        self.kv = Storages(kv_caches)
        self.reload_weights = reload_weights
        if level == 1:
            self.params.offload(pin)
        else:
            self.params.discard()
        self.buffers.offload(pin)
        self.kv.discard()
        self.asleep: set[str] = set(TAGS)

    def wake(self, tags: list[str] | None) -> None:
        """Restore the memory of ``tags`` (None: all); a tag awake already
        is left as it is. The weights come back before the cache."""
        tags = list(TAGS) if tags is None else list(tags)
        unknown = sorted(set(tags) - set(TAGS))
        if unknown:
            raise ValueError(f"unknown wake_up tags {unknown}; the tags are {list(TAGS)}")
        if WEIGHTS in tags and WEIGHTS in self.asleep:
            self.params.restore()
            self.buffers.restore()
            if self.level == 2:
                self.reload_weights()
            self.asleep.discard(WEIGHTS)
        if KV_CACHE in tags and KV_CACHE in self.asleep:
            self.kv.restore()
            self.asleep.discard(KV_CACHE)
