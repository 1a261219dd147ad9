"""Checks of ``RequestOutput.metrics`` against the clocks read around the
call that made the output."""

from __future__ import annotations

import time


class Window:
    """``with Window() as w:`` reads both clocks before and after the block."""

    def __enter__(self) -> Window:
        self.wall0, self.mono0 = time.time(), time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.wall1, self.mono1 = time.time(), time.monotonic()


def assert_in_order(output, window: Window, engine_side: bool) -> None:
    """The output's times lie in the window and in their order: arrival,
    (where the engine ran in the process: queued, first scheduled,) first
    token, last token; the first token's latency is from the arrival. The
    output has tokens from more than one step."""
    m = output.metrics
    assert window.wall0 <= m.arrival_time <= window.wall1
    assert window.mono0 <= m.first_token_ts < m.last_token_ts <= window.mono1
    arrival = m.first_token_ts - m.first_token_latency  # on the monotonic clock
    assert window.mono0 <= arrival <= m.first_token_ts
    if engine_side:
        assert arrival <= m.queued_ts <= m.scheduled_ts <= m.first_token_ts
    else:
        assert m.queued_ts is None and m.scheduled_ts is None
    assert m.num_generation_tokens == sum(len(c.token_ids) for c in output.outputs)
