"""benchmarks/tables.py turns the kept JSON results into the README's rows."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tables_from_results(tmp_path):
    decode = {"results": [
        {"batch": 1, "context": 512, "step_ms": 4.9287, "ratio_to_floor": 1.314,
         "between_steps_async": {"idle_fraction": 0.0003}, "idle_async": {"idle_fraction": 0.06}},
        {"batch": 1, "context": 4096, "step_ms": 5.1208, "ratio_to_floor": 1.327},
        {"batch": 256, "context": 512, "step_ms": 12.0851, "ratio_to_floor": 1.564},
        {"batch": 256, "context": 4096, "skipped": "KV does not fit"},
    ]}
    (tmp_path / "decode_8b.json").write_text("log line\n" + json.dumps(decode) + "\n")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "tables.py"),
                          "--results", str(tmp_path)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert "| 8B | 1 | 4.93 (1.31) | 5.12 (1.33) | 0.03% / 6.0% |" in out
    assert "| 8B | 256 | 12.09 (1.56) | does not fit | - / - |" in out
    assert "<!-- decode_1b.json: not found -->" in out


def test_tables_with_peer_floor_ttft_and_prefill(tmp_path):
    bandwidth = {"read_sum_GBps": 4100.0, "read_triton_GBps": 4440.2, "copy_GBps": 4290.0,
                 "used": "read_triton", "used_GBps": 4440.2}
    decode = {"bandwidth": bandwidth, "date": "2026-12-01", "results": [
        {"batch": 1, "context": 512, "step_ms": 4.6, "ratio_to_floor": 1.357,
         "peer_step_ms": 4.59, "tprun_to_peer": 1.002,
         "between_steps_async": {"idle_fraction": 0.0003}, "idle_async": {"idle_fraction": 0.06}},
        {"batch": 1, "context": 4096, "step_ms": 5.0, "ratio_to_floor": 1.2},
        {"batch": 64, "context": 512, "step_ms": 6.3, "ratio_to_floor": 1.5,
         "peer_step_ms": 6.58, "tprun_to_peer": 0.957},
        {"batch": 64, "context": 4096, "skipped": "KV does not fit"},
    ]}
    e2e = {"hf": {"output_tokens_per_s": 400.0, "decode_step_ms": 70.0},
           "tprun_same_batch": {"output_tokens_per_s": 4600.0, "itl_ms_p50": 5.5},
           "tprun_all": {"output_tokens_per_s": 10000.0, "ttft_ms_p50": 1690.0,
                         "itl_ms_p50": 13.5, "itl_ms_p99": 190.0},
           "throughput_ratio_same_batch": 11.5, "hf_host_bound": True,
           "hf_host_bound_reason": "HF decode step 70.0 ms at batch 32, 68.0 ms at batch 1",
           "ttft": {"ttft_all_s": 1.63, "prompts": 32, "prompt_len": 2048,
                    "prefill_floor_s": 1.2405, "ttft_ratio_to_floor": 1.314,
                    "matmul_tflops": 793.2}}
    attention = {"results": [
        {"name": "decode", "shape": "1x512", "backend": "triton", "ms": 0.01, "sdpa_ms": 0.01,
         "ratio": 1.0},
        {"name": "prefill", "shape": "1x4096", "backend": "triton", "path": "triton",
         "ms": 1.46, "sdpa_ms": 1.0, "ratio": 1.46},
        {"name": "prefill", "shape": "1x4096", "backend": "triton_flash_prefill",
         "path": "varlen", "ms": 0.98, "sdpa_ms": 1.0, "ratio": 0.98},
    ]}
    (tmp_path / "decode_8b.json").write_text(json.dumps(decode) + "\n")
    (tmp_path / "e2e_8b.json").write_text(json.dumps(e2e) + "\n")
    (tmp_path / "attention_prefill.json").write_text(json.dumps(attention) + "\n")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "tables.py"),
                          "--results", str(tmp_path)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert "8B: floor at 4440 GB/s (read_triton; read 4100.0 by sum, 4440.2 by Triton" in out
    assert ("| shape | batch | ctx 512: tprun ms (x floor) | ctx 512: peer ms (tprun / peer) "
            "| ctx 4096: tprun ms (x floor) | ctx 4096: peer ms (tprun / peer) |") in out
    assert "| 8B | 1 | 4.60 (1.36) | 4.59 (1.00) | 5.00 (1.20) | - | 0.03% / 6.0% |" in out
    assert "| 8B | 64 | 6.30 (1.50) | 6.58 (0.96) | does not fit | - | - / - |" in out
    assert "HF host-bound: True (HF decode step 70.0 ms at batch 32" in out
    assert "| 1.630 s | 32 x 2048 | 1.240 s | 1.31 | 793 TFLOP/s |" in out
    assert "| 1x4096 | 1.000 | 1.460 (1.46, triton) | 0.980 (0.98, varlen) |" in out
