"""Grammar compilation off the engine loop: a thread pool, a cache, a time limit.

``submit(key)`` starts compiling (or finds the grammar in the cache) and
never waits; ``ready(key)`` says whether ``result(key)`` would return at
once; ``result(key)`` waits for the compile, at most until the key's
deadline (``timeout_s`` after its first submission), and returns the
template matcher or raises ``GrammarError`` (an invalid grammar, or one that
did not compile in time). llguidance drops the GIL while it compiles, so a
slow compile runs beside the engine loop instead of stalling it.

The cache keeps the ``max_entries`` most recently used keys, failures
included (a bad schema sent again fails at once). A compile that ran out of
time stays cached while it goes on: once it finishes, later requests use it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from engine.structured_outputs.backend import GrammarError, GuidanceBackend
from engine.structured_outputs.params import GrammarKey

DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class _Entry:
    future: Future
    deadline: float


class GrammarCompiler:
    def __init__(self, backend: GuidanceBackend, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_workers: int = 2, max_entries: int = 512):
        self.backend = backend
        self.timeout_s = timeout_s
        self.max_entries = max_entries
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar")
        self.cache: OrderedDict[GrammarKey, _Entry] = OrderedDict()
        self.lock = threading.Lock()

    def submit(self, key: GrammarKey) -> None:
        self._entry(key)

    def ready(self, key: GrammarKey) -> bool:
        entry = self._entry(key)
        return entry.future.done() or time.monotonic() >= entry.deadline

    def result(self, key: GrammarKey) -> Any:
        entry = self._entry(key)
        try:
            return entry.future.result(timeout=max(0.0, entry.deadline - time.monotonic()))
        except FutureTimeout:
            raise GrammarError(f"the {key.kind} constraint did not compile within "
                               f"{self.timeout_s:g} s") from None

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _entry(self, key: GrammarKey) -> _Entry:
        with self.lock:
            entry = self.cache.get(key)
            if entry is None:
                future = self.pool.submit(self.backend.compile, key)
                entry = _Entry(future, time.monotonic() + self.timeout_s)
                self.cache[key] = entry
                while len(self.cache) > self.max_entries:
                    self.cache.popitem(last=False)
            else:
                self.cache.move_to_end(key)
            return entry
