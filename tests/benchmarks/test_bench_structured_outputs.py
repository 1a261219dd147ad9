"""benchmarks/bench_structured_outputs.py on CPU: each part runs and its
summary holds what the README's table reads (the tiny shape for the engine
parts; SmolLM2's tokenizer for the mask fill and the compile)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.proc_utils import run_in_session


def _run(tmp_path, *args: str) -> dict:
    out = tmp_path / "summary.json"
    result, leftovers = run_in_session(
        [sys.executable, "-m", "benchmarks.bench_structured_outputs", *args, "--out", str(out)],
        timeout=280, env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    return json.loads(out.read_text())


@pytest.mark.timeout(300)
def test_fill_and_compile(tmp_path):
    fill = _run(tmp_path, "fill", "--batches", "1", "4", "--repeats", "3")
    assert [row["batch"] for row in fill["rows"]] == [1, 4]
    for row in fill["rows"]:
        assert row["fill_us_per_token"] == pytest.approx(
            row["fill_ms_per_step"] * 1e3 / row["batch"], rel=0.05, abs=0.2)
        assert row["accept_us_per_token"] > 0
    compiled = _run(tmp_path, "compile", "--repeats", "3")
    assert 0 < compiled["typical_compile_ms_median"] <= compiled["typical_compile_ms_max"]
    assert compiled["tokenizer_build_ms"] > 0 and compiled["slow_schema_compile_ms"] > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_step_stall_and_idle_on_tiny(tmp_path):
    common = ["--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--input-len", "16"]
    step = _run(tmp_path, "step", *common, "--batches", "2", "--output-len", "24")
    (row,) = step["rows"]
    assert row["constrained_steps"] > 5 and row["unconstrained_steps"] > 5
    assert row["overhead"] == pytest.approx(
        row["constrained_step_ms"] / row["unconstrained_step_ms"] - 1, abs=1e-3)
    stall = _run(tmp_path, "stall", *common, "--batch", "2", "--steps", "40",
                 "--output-len", "60")
    assert stall["before"]["steps"] == 10 and stall["compiling"]["steps"] >= 1
    idle = _run(tmp_path, "idle", *common, "--batch", "2", "--steps", "12", "--output-len", "40")
    assert [row["constrained"] for row in idle["rows"]] == [False, True]
    for row in idle["rows"]:  # host clock readings on CPU: mechanics, not speed
        assert row["steps"] >= 10
        assert row["idle_fraction"] == pytest.approx(
            row["idle_between_steps"] + row["idle_waiting_for_mask"], abs=2e-4)


class _Event:
    """A recorded CUDA event's stand-in: its device time in ms."""

    def __init__(self, t: float):
        self.t = t

    def elapsed_time(self, later: _Event) -> float:
        return later.t - self.t


def test_idle_fraction_counts_gaps_between_steps_and_before_sampling():
    from benchmarks.bench_structured_outputs import idle_fraction

    # Step 1: 0..10 ms, waits 2 ms for its mask (forward ends at 6, sampling
    # starts at 8); step 2 starts 1 ms after step 1 ends and waits for nothing.
    marks = [[_Event(0), _Event(6), _Event(8), _Event(10)],
             [_Event(11), _Event(17), _Event(17), _Event(20)],
             [_Event(21), None, None, None]]  # a step still running: left out
    row = idle_fraction(marks)
    assert row["steps"] == 2
    assert row["idle_between_steps"] == pytest.approx(1 / 20)
    assert row["idle_waiting_for_mask"] == pytest.approx(2 / 20)
    assert row["idle_fraction"] == pytest.approx(3 / 20)
    assert row["gap_us_median"] == 1000.0
