"""A progress bar that moves with every step, not only with finished requests.

The bar counts requests done; its postfix shows the output tokens so far
and their rate, refreshed after each engine step (tqdm limits redraws to
its ``mininterval``), so a long run shows progress before the first
request finishes.
"""

from __future__ import annotations

import time

from tqdm import tqdm


class RequestProgress:
    """``with RequestProgress(n, "generate", enabled) as p: p.advance(...)``."""

    def __init__(self, num_requests: int, desc: str, enabled: bool = True):
        self.bar = tqdm(total=num_requests, desc=desc, unit="req", disable=not enabled)
        self.num_tokens = 0
        self.start = self.drawn_at = time.perf_counter()

    def advance(self, num_finished: int, num_tokens: int) -> None:
        """One step's news: requests that finished, output tokens it made.
        Redraws at most every ``mininterval`` seconds when none finished
        (``update`` redraws by itself when the count moves)."""
        self.num_tokens += num_tokens
        if self.bar.disable:
            return
        now = time.perf_counter()
        rate = self.num_tokens / max(now - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.num_tokens} tok, {rate:.1f} tok/s", refresh=False)
        if num_finished:
            self.bar.update(num_finished)
        elif now - self.drawn_at >= self.bar.mininterval:
            self.bar.refresh()
            self.drawn_at = now

    def __enter__(self) -> RequestProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
