"""Smoke test of benchmarks/bench_http_host.py: the HTTP front end driven in
process with a stand-in engine link, a few requests."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.bench_http_host import STAGES
from tests.helpers.proc_utils import ROOT


@pytest.mark.timeout(120)
def test_every_request_is_answered_and_every_stage_traced():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_http_host", "--prompt-len", "16",
         "--requests", "5", "--warmup", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["prompt_len"] == 16
    assert summary["request"]["requests"] == 5
    gaps = [f"{a}->{b}_us" for a, b in zip(STAGES, STAGES[1:])]
    assert all(summary["request"][gap] >= 0 for gap in gaps)
    assert summary["parse"]["fast_lane_us"] > 0
