"""benchmarks/bench_repetition.py: each output's ``hits`` are the prefixes
a literal reading of the definition finds repeating (the benchmark times
the detector the scheduler uses, not a shortcut of it)."""

from __future__ import annotations

from benchmarks.bench_repetition import measure, outputs
from tests.engine.test_repetition_detection import brute_force_verdict


def test_hits_are_the_brute_force_counts():
    for tokens in outputs(400).values():
        for max_size, count in ((40, 2), (12, 3)):
            row = measure(tokens, max_size, count, tail=50)
            want = sum(brute_force_verdict(tokens[:end], max_size, count, 0)
                       for end in range(1, len(tokens) + 1))
            assert row["hits"] == want and row["tokens"] == 400
            assert row["mean_us"] > 0 and row["tail_mean_us"] > 0
