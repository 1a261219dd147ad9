"""``engine.request_metrics``: one prompt's engine requests joined into
vLLM's ``RequestStateStats``, against values worked out by hand."""

from __future__ import annotations

import pytest

from engine.request_metrics import RequestTimes, request_stats


def _times(arrival_time: float, arrival_ts: float, queued_ts=None, scheduled_ts=None,
           token_times=()) -> RequestTimes:
    times = RequestTimes()
    times.arrival_time, times.arrival_ts = arrival_time, arrival_ts
    times.queued_ts, times.scheduled_ts = queued_ts, scheduled_ts
    for t in token_times:
        times.tokens_at(t)
    return times


def test_tokens_at_gives_the_gap_since_the_last_tokens():
    times = _times(1000.0, 10.0)
    assert times.first_token_latency is None
    assert times.tokens_at(10.5) is None  # the first tokens
    assert times.tokens_at(10.75) == pytest.approx(0.25)
    assert times.tokens_at(11.5) == pytest.approx(0.75)
    assert (times.first_token_ts, times.last_token_ts) == (10.5, 11.5)
    assert times.first_token_latency == pytest.approx(0.5)


def test_choices_join_into_the_earliest_and_latest_times():
    """Choice a arrives first but b gets the first token; c was aborted
    before any token and adds no token time."""
    a = _times(1000.0, 10.0, 10.1, 10.4, (11.0, 11.5))
    b = _times(1000.2, 10.2, 10.3, 10.3, (10.9, 12.0))
    c = _times(1000.3, 10.3, 10.35, None)
    stats = request_stats([b, c, a], num_generation_tokens=4)
    assert stats.arrival_time == 1000.0
    assert (stats.queued_ts, stats.scheduled_ts) == (10.1, 10.3)
    assert (stats.first_token_ts, stats.last_token_ts) == (10.9, 12.0)
    assert stats.first_token_latency == pytest.approx(0.9)  # from a's arrival
    assert stats.num_generation_tokens == 4


def test_times_nobody_saw_stay_none():
    stats = request_stats([_times(5.0, 1.0)], num_generation_tokens=0)
    assert (stats.queued_ts, stats.scheduled_ts, stats.first_token_ts, stats.last_token_ts,
            stats.first_token_latency) == (None, None, None, None, None)
    assert stats.arrival_time == 5.0
