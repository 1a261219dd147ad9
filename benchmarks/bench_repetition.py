"""The cost of ``repetition_detection``'s check per output token (host only).

    python -m benchmarks.bench_repetition [--tokens 30000] [--tail 1000]

Feeds one ``RepetitionDetector`` an output of ``--tokens`` tokens, as the
scheduler does (one ``append`` per token), and reports the mean time a
token over the whole output and over its last ``--tail`` tokens (where the
window is fullest), for three outputs: token ids drawn uniformly from a
32,000-token vocabulary, ids drawn Zipf-distributed (s = 1.1) from 50,000
(a text-like spread, a few ids frequent), and the bytes of this
repository's docs and sources (a 256-symbol vocabulary: many repeated
grams), each at two settings: ``max_pattern_size`` 65536 with
``min_count`` 2, and 1024 with 3. Also ``hits``: tokens after which the
output ended in a repetition (the check goes on past them here). One JSON
line per measurement, a JSON summary last.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from benchmarks.common import emit_summary
from engine.repetition import RepetitionDetectionParams, RepetitionDetector

SETTINGS = ((65536, 2), (1024, 3))
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TEXT_FILES = ("README.md", "docs/architecture.md", "engine/scheduler.py")


def outputs(num_tokens: int) -> dict[str, list[int]]:
    rng = np.random.default_rng(0)
    ranks = rng.zipf(1.1, 4 * num_tokens)
    text = b"".join(open(os.path.join(_ROOT, name), "rb").read() for name in _TEXT_FILES)
    return {"uniform_32000": rng.integers(0, 32000, num_tokens).tolist(),
            "zipf_1.1_50000": ranks[ranks <= 50000][:num_tokens].tolist(),
            "text_bytes": list(text[:num_tokens])}


def measure(tokens: list[int], max_pattern_size: int, min_count: int, tail: int) -> dict:
    detector = RepetitionDetector(RepetitionDetectionParams(
        max_pattern_size=max_pattern_size, min_count=min_count))
    head = len(tokens) - tail
    hits = 0
    start = time.perf_counter()
    for token in tokens[:head]:
        hits += detector.append(token)
    middle = time.perf_counter()
    for token in tokens[head:]:
        hits += detector.append(token)
    end = time.perf_counter()
    return {"tokens": len(tokens), "max_pattern_size": max_pattern_size,
            "min_count": min_count, "mean_us": (end - start) / len(tokens) * 1e6,
            "tail_mean_us": (end - middle) / tail * 1e6, "hits": hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=30000)
    parser.add_argument("--tail", type=int, default=1000)
    parser.add_argument("--out", default=None, help="also write the summary here")
    args = parser.parse_args()
    rows = []
    for name, tokens in outputs(args.tokens).items():
        for max_pattern_size, min_count in SETTINGS:
            row = {"output": name, **measure(tokens, max_pattern_size, min_count,
                                              min(args.tail, len(tokens)))}
            print(json.dumps(row), flush=True)
            rows.append(row)
    emit_summary({"bench": "repetition", "rows": rows}, args.out)


if __name__ == "__main__":
    main()
