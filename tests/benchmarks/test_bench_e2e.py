"""benchmarks/bench_e2e.py on CPU (tiny shape): HF's host-bound verdict follows
its two step times, and the TTFT sits beside the prefill FLOP floor recomputed
here."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.helpers.proc_utils import ROOT, run_in_session


def floor_flops(prompts: int, length: int) -> int:
    """The tiny shape's prefill FLOPs: 2 layers of 128 x (128 + 2 x 64) +
    128 x 128 + 3 x 128 x 256 = 147,456 projection weights for every token,
    its untied 512 x 128 head for each prompt's last token, and 4 query heads
    of 32 dims over the keys each token sees (q.k and p.v, 2 FLOPs a dim
    each)."""
    seen = length * (length + 1) // 2
    return (2 * 2 * 147_456 * prompts * length + 2 * 512 * 128 * prompts
            + 2 * 4 * 32 * 2 * 2 * seen * prompts)


def _run_e2e(tmp_path, timeout: float, *args: str) -> dict:
    """bench_e2e on CPU (tiny shape, float32, one TTFT round, a 256^3 matmul
    for the floor, 0.2 s for its held rate) with ``args``; its summary, once
    it exited cleanly and left no process behind."""
    out = tmp_path / "e2e.json"
    result, leftovers = run_in_session(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_e2e.py"), "--shape", "tiny",
         "--device", "cpu", "--dtype", "float32", "--ttft-rounds", "1", "--matmul-n", "256",
         "--matmul-sustain-s", "0.2",
         *args, "--out", str(out)],
        timeout=timeout, env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_e2e_summary_fields(tmp_path):
    s = _run_e2e(tmp_path, 380, "--num-requests", "4", "--input-len", "16", "--output-len", "4",
                 "--hf-batch", "2", "--hf-requests", "2", "--ttft-prompts", "2",
                 "--ttft-len", "40")
    big, one = s["hf"]["decode_step_ms"], s["hf_batch1"]["decode_step_ms"]
    assert s["hf_host_bound"] == (abs(big / one - 1) <= 0.2)
    assert f"{big:.1f} ms at batch 2" in s["hf_host_bound_reason"]
    assert s["tprun_all"]["output_tokens"] == 4 * 4
    ttft = s["ttft"]
    assert ttft["prompts"] == 2 and ttft["prompt_len"] == 40 and len(ttft["rounds_s"]) == 1
    assert ttft["prefill_flops"] == floor_flops(2, 40)
    floor_s = floor_flops(2, 40) / (ttft["matmul_tflops"] * 1e12)
    assert ttft["prefill_floor_s"] == pytest.approx(floor_s, rel=1e-2, abs=1e-4)
    assert ttft["ttft_ratio_to_floor"] == pytest.approx(ttft["ttft_all_s"] / floor_s, rel=2e-2)
    sustained_s = floor_flops(2, 40) / (ttft["matmul_tflops_sustained"] * 1e12)
    assert ttft["matmul_sustain_s"] == 0.2
    assert ttft["ttft_ratio_to_sustained_rate"] == pytest.approx(
        ttft["ttft_all_s"] / sustained_s, rel=2e-2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ttft_only(tmp_path):
    """``--ttft-only``: the TTFT and its floor, no HF or decode runs."""
    s = _run_e2e(tmp_path, 280, "--ttft-only", "--ttft-prompts", "3", "--ttft-len", "24")
    assert "hf" not in s and "tprun_all" not in s
    ttft = s["ttft"]
    assert ttft["prompts"] == 3 and ttft["prompt_len"] == 24 and len(ttft["rounds_s"]) == 1
    floor_s = floor_flops(3, 24) / (ttft["matmul_tflops"] * 1e12)
    assert ttft["prefill_floor_s"] == pytest.approx(floor_s, rel=1e-2, abs=1e-4)


def test_prefill_floor_without_a_held_rate_reports_the_burst_alone():
    """``--matmul-sustain-s 0``: the floor from the burst, no held rate's keys."""
    import torch

    from benchmarks.bench_e2e import prefill_floor

    ttft = {"prompts": 2, "prompt_len": 40, "ttft_all_s": 0.5}
    result = prefill_floor("tiny", ttft, torch.device("cpu"), 64, 0.0)
    floor_s = floor_flops(2, 40) / (result["matmul_tflops"] * 1e12)
    assert result["prefill_flops"] == floor_flops(2, 40)
    assert result["prefill_floor_s"] == pytest.approx(floor_s, rel=1e-2, abs=1e-4)
    assert result["ttft_ratio_to_floor"] == pytest.approx(0.5 / floor_s, rel=2e-2)
    assert "matmul_tflops_sustained" not in result and "matmul_sustain_s" not in result
