"""benchmarks/bench_tp.py on CPU: TP=2 over gloo decodes what TP=1 decodes."""

import json
import os
import sys

import pytest

from tests.helpers.proc_utils import ROOT, run_in_session


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tp2_agrees_with_tp1_on_cpu(tmp_path):
    out = tmp_path / "tp.json"
    scratch = tmp_path / "tmp"  # the benchmark's temporary files, removed by it
    scratch.mkdir()
    result, leftovers = run_in_session(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_tp.py"), "--shape", "tiny",
         "--device", "cpu", "--dtype", "float32", "--tp", "1", "2", "--batch", "2", "3",
         "--input-len", "16", "--output-len", "8", "--agree-tokens", "12",
         "--ttft-prompts", "3", "--ttft-len", "20", "--ttft-rounds", "1", "--out", str(out)],
        timeout=170, env={"TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    assert list(scratch.iterdir()) == []
    summary = json.loads(out.read_text())
    tp1, tp2 = summary["results"]
    assert tp1["first_differing_token"] == [None] * 8 and tp1["max_logprob_gap"] == 0
    # float32 sums in another order: the same greedy tokens, logprobs within 1e-4.
    assert tp2["first_differing_token"] == [None] * 8
    assert 0 < tp2["max_logprob_gap"] < 1e-4
    for row in (tp1, tp2):  # three prompts of 20 tokens, one round after the warm-up
        assert row["ttft"]["prompts"] == 3 and len(row["ttft"]["rounds_s"]) == 1
        assert row["ttft"]["ttft_all_s"] > 0
    for mode in ("async", "sync"):
        assert tp2["speed"][mode]["2"]["output_tokens"] == 16
        assert tp2["speed"][mode]["3"]["output_tokens"] == 24
