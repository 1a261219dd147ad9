"""benchmarks/bench_attention.py --smoke on CPU (Triton interpreter): the prefill
rows of both backends, fresh prompts and a chunk after a cached prefix, agree
with SDPA."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.helpers.proc_utils import ROOT, run_in_session


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_prefill_rows_of_both_backends(tmp_path):
    out = tmp_path / "attention.json"
    result, leftovers = run_in_session(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_attention.py"), "--smoke",
         "--prefill-only", "--backend", "both", "--out", str(out)], timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    report = json.loads(out.read_text())
    rows = report["results"]
    shapes = ["1x64", "2x32", "1x32+48 cached"]
    assert [(r["shape"], r["backend"]) for r in rows] == [
        (s, b) for s in shapes for b in ("triton", "triton_flash_prefill")]
    tol = 1e-4 if report["dtype"] == "float32" else 3e-2  # bf16 when CUDA runs it
    for row in rows:
        assert row["name"] == "prefill" and row["max_abs_err"] < tol
        assert row["ratio"] == pytest.approx(row["ms"] / row["sdpa_ms"])
        if report["device"].startswith("cpu"):
            assert row["path"] == "triton"  # torch's flash kernels are CUDA-only
