"""benchmarks/bench_attention.py --smoke on CPU (Triton interpreter): the prefill
rows of every backend, fresh prompts and a chunk after a cached prefix, agree
with SDPA."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.helpers.proc_utils import ROOT, run_in_session


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_prefill_rows_of_every_backend(tmp_path):
    out = tmp_path / "attention.json"
    result, leftovers = run_in_session(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_attention.py"), "--smoke",
         "--prefill-only", "--backend", "all", "--out", str(out)], timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    report = json.loads(out.read_text())
    rows = report["results"]
    shapes = ["1x64", "2x32", "1x32+48 cached"]
    assert [(r["shape"], r["backend"]) for r in rows] == [
        (s, b) for s in shapes for b in ("triton", "triton_fresh", "triton_flash_prefill")]
    tol = 1e-4 if report["dtype"] == "float32" else 3e-2  # bf16 when CUDA runs it
    for row in rows:
        assert row["name"] == "prefill" and row["max_abs_err"] < tol
        assert row["ratio"] == pytest.approx(row["ms"] / row["sdpa_ms"])
        if report["device"].startswith("cpu"):
            assert row["path"] == "triton"  # torch's flash kernels are CUDA-only


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_prefill_kernel_rows_name_the_kernel_that_ran(tmp_path):
    """``--prefill-kernels sdpa`` times triton_flash_prefill with per-row SDPA
    (on CPU too): one row per case, its path "sdpa", within tolerance of the
    dense SDPA reference (which reads K/V without the paged cache)."""
    out = tmp_path / "attention.json"
    result, leftovers = run_in_session(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_attention.py"), "--smoke",
         "--prefill-only", "--backend", "triton_flash_prefill", "--prefill-kernels", "sdpa",
         "--out", str(out)], timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    report = json.loads(out.read_text())
    rows = report["results"]
    assert [(r["shape"], r["backend"], r["path"]) for r in rows] == [
        (s, "triton_flash_prefill:sdpa", "sdpa") for s in ["1x64", "2x32", "1x32+48 cached"]]
    tol = 1e-4 if report["dtype"] == "float32" else 3e-2
    assert all(row["max_abs_err"] < tol for row in rows)
