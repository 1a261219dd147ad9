"""Smoke test of benchmarks/bench_ipc.py: TP 1 and 2, a few iterations."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.helpers.proc_utils import ROOT, run_in_session

BENCH = os.path.join(ROOT, "benchmarks", "bench_ipc.py")
STATS = {"median", "p90", "p99", "mean", "n"}


def run_bench(args: list[str], timeout: float):
    """Run the benchmark in its own session; returns (result, leftover pids)."""
    return run_in_session([sys.executable, BENCH, *args], timeout)


@pytest.mark.timeout(60)
def test_bench_ipc_tp1_tp2_summary(tmp_path):
    out_file = tmp_path / "ipc.json"
    result, leftovers = run_bench(["--tp", "1", "2", "--iters", "40", "--warmup", "5",
                                   "--rounds", "2", "--out", str(out_file)], timeout=50)
    assert result.returncode == 0, result.stderr
    assert leftovers == []
    last = result.stdout.strip().splitlines()[-1]
    summary = json.loads(last)
    assert json.loads(out_file.read_text()) == summary
    assert summary["benchmark"] == "ipc_round_trip"
    assert summary["config"]["num_reqs"] == 256
    assert summary["message_bytes"]["scheduler_output"] > 256 * 8
    assert summary["message_bytes"]["model_runner_output"] > 256 * 4
    # One delta a request: its id, one token, its text, finished False.
    assert summary["message_bytes"]["engine_outputs"] > 256 * len("req-1000 tok")
    serde = summary["serde_us"]
    assert set(serde) == {"encode_plan", "decode_plan", "encode_reply", "decode_reply", "total",
                          "encode_outputs", "decode_outputs"}
    assert serde["total"] == pytest.approx(serde["encode_plan"] + serde["decode_plan"]
                                           + serde["encode_reply"] + serde["decode_reply"],
                                           abs=0.02)
    rows = {(r["transport"], r["tp"]): r for r in summary["results"]}
    assert set(rows) == {("ipc", 1), ("ipc", 2), ("tcp", 1), ("tcp", 2)}
    for row in rows.values():
        for side in ("ipc_us", "bare_us"):
            stats = row[side]
            assert set(stats) == STATS and stats["n"] == 40
            assert 0 < stats["median"] <= stats["p90"] <= stats["p99"]
        assert row["ratio_median"] == pytest.approx(
            row["ipc_us"]["median"] / row["bare_us"]["median"], rel=1e-2)
        assert row["ratio_p99"] > 0
    assert summary["target"]["tp"] == 8 and summary["target"]["met"] == {}
