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
    out = subprocess.run([sys.executable, "-m", "benchmarks.tables", "--results", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout
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
                    "matmul_tflops": 793.2, "matmul_tflops_sustained": 664.0},
           "shape": "8b"}
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
    out = subprocess.run([sys.executable, "-m", "benchmarks.tables", "--results", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout
    assert "8B: floor at 4440 GB/s (read_triton; read 4100.0 by sum, 4440.2 by Triton" in out
    assert ("| shape | batch | ctx 512: tprun ms (x floor) | ctx 512: peer ms (tprun / peer) "
            "| ctx 4096: tprun ms (x floor) | ctx 4096: peer ms (tprun / peer) |") in out
    assert "| 8B | 1 | 4.60 (1.36) | 4.59 (1.00) | 5.00 (1.20) | - | 0.03% / 6.0% |" in out
    assert "| 8B | 64 | 6.30 (1.50) | 6.58 (0.96) | does not fit | - | - / - |" in out
    assert "HF host-bound: True (HF decode step 70.0 ms at batch 32" in out
    # The floor from benchmarks/floor.py, not the file's own fields: 9.50e14
    # FLOPs (test_bench_floor.test_eight_b_prefill_floor) at 793.2 TFLOP/s;
    # at the held 664.0 they take 1.4308 s, which 1.630 s is 1.139x of.
    assert ("| 1.630 s | 32 x 2048 | 1.198 s | 1.36 | 793 TFLOP/s | 664 TFLOP/s (1.14) |"
            in out)
    assert "| 1x4096 | 1.000 | 1.460 (1.46, triton) | 0.980 (0.98, varlen) |" in out


def test_ttft_table_without_held_rate(tmp_path, capsys):
    """A file written before the held rate was measured shows "-" in its column."""
    from benchmarks import tables

    e2e = {"shape": "8b", "ttft": {"ttft_all_s": 1.63, "prompts": 32, "prompt_len": 2048,
                                   "matmul_tflops": 793.2}}
    (tmp_path / "e2e_8b.json").write_text(json.dumps(e2e) + "\n")
    tables.ttft_table(str(tmp_path))
    assert "| 1.630 s | 32 x 2048 | 1.198 s | 1.36 | 793 TFLOP/s | - |" in capsys.readouterr().out


def _decode_run(rows: list[tuple[int, int, float, float]], used_gbps: float) -> dict:
    bandwidth = {"read_sum_GBps": 4000.0, "read_triton_GBps": used_gbps, "copy_GBps": 4200.0,
                 "used": "read_triton", "used_GBps": used_gbps}
    return {"bandwidth": bandwidth, "date": "2026-12-02", "results": [
        {"batch": b, "context": c, "step_ms": step, "floor_ms": floor,
         "ratio_to_floor": round(step / floor, 3)} for b, c, step, floor in rows]}


def test_tp_decode_table(tmp_path, capsys):
    """Rows by context then batch; x floor and speed-up from the unrounded steps;
    a row one of the runs lacks is left out; a missing run prints no table."""
    from benchmarks import tables

    runs = {
        "tp1": [(8, 512, 4.9434, 3.5), (1, 512, 4.0, 3.0), (1, 4096, 5.0, 3.2)],
        "tp2": [(1, 4096, 3.125, 1.6), (8, 512, 3.4869, 1.7308), (1, 512, 2.5, 1.0)],
        "tp2_nccl": [(1, 512, 2.8, 1.0), (8, 512, 3.7889, 1.73)],
    }
    for run, rows in runs.items():
        summary = _decode_run(rows, 4491.3 if run == "tp2" else 4400.0)
        (tmp_path / f"tp_ab_7b_{run}.json").write_text(json.dumps(summary) + "\n")
    tables.tp_decode_table(str(tmp_path), "7b")
    tables.tp_decode_table(str(tmp_path), "9b")
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    assert lines == [
        "| 7B, batch x ctx | TP=1 | TP=2, custom all-reduce (x floor) | TP=2, NCCL "
        "| speed-up TP=2 / TP=1 |",
        "| --- | --- | --- | --- | --- |",
        "| 1 x 512 | 4.00 | 2.50 (2.50) | 2.80 | 1.60x |",
        # 3.4869 / 1.7308 = 2.0146 and 4.9434 / 3.4869 = 1.4177, not the rounded cells' quotients
        "| 8 x 512 | 4.94 | 3.49 (2.01) | 3.79 | 1.42x |",
    ]
    assert "TP=2 per rank, 7B: floor at 4491 GB/s (read_triton;" in out
    assert "<!-- tp_ab_9b_tp1.json: not found -->" in out
    assert "9B, batch x ctx" not in out


def _speed(tok_s: float, itl: float, ttft: float) -> dict:
    return {"output_tokens_per_s": tok_s, "itl_ms_p50": itl, "ttft_ms_p50": ttft}


def test_tp_e2e_table(tmp_path, capsys):
    """Async figures side by side, sync throughput last, batches in numeric
    order, then the agreement line of the larger size."""
    from benchmarks import tables

    one = {"tp": 1, "first_differing_token": [None, None], "max_logprob_gap": 0.0, "speed": {
        "async": {"256": _speed(2000.0, 14.0, 1700.0), "32": _speed(1000.0, 6.0, 200.0)},
        "sync": {"256": _speed(1600.0, 18.0, 1800.0), "32": _speed(800.0, 8.0, 250.0)}}}
    two = {"tp": 2, "first_differing_token": [3, None], "max_logprob_gap": 0.0123, "speed": {
        "async": {"256": _speed(2300.0, 10.0, 1750.0), "32": _speed(1500.0, 4.04, 150.4)},
        "sync": {"256": _speed(2000.0, 15.0, 1650.0), "32": _speed(1000.0, 6.0, 230.0)}}}
    summary = {"benchmark": "tp", "date": "2026-12-02", "results": [one, two]}
    (tmp_path / "tp_7b.json").write_text(json.dumps(summary) + "\n")
    tables.tp_e2e_table(str(tmp_path), "7b")
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    assert lines[2:] == [
        "| 32 | 1000.0 | 1500.0 | 1.50x | 6.0 / 4.0 ms | 200 / 150 ms | 800.0 / 1000.0 (1.25x) |",
        "| 256 | 2000.0 | 2300.0 | 1.15x | 14.0 / 10.0 ms | 1700 / 1750 ms "
        "| 1600.0 / 2000.0 (1.25x) |",
    ]
    assert lines[0].startswith("| 7B, requests | TP=1 tok/s | TP=2 tok/s | speed-up |")
    assert ("TP=2 against TP=1, first differing greedy token per prompt: 3, none; "
            "largest logprob gap before it 0.012 (2026-12-02)") in out


def test_tp_e2e_table_async_only_with_ttft(tmp_path, capsys):
    """A run without sync rows prints "-" there; the prefill-alone TTFT line
    gives both sizes and their ratio."""
    from benchmarks import tables

    ttft = {"prompts": 4, "prompt_len": 64, "max_num_batched_tokens": 256}
    one = {"tp": 1, "first_differing_token": [None], "max_logprob_gap": 0.0,
           "speed": {"async": {"8": _speed(100.0, 5.0, 50.0)}},
           "ttft": {**ttft, "ttft_all_s": 1.5}}
    two = {"tp": 2, "first_differing_token": [None], "max_logprob_gap": 0.0,
           "speed": {"async": {"8": _speed(180.0, 3.0, 30.0)}},
           "ttft": {**ttft, "ttft_all_s": 0.6}}
    summary = {"benchmark": "tp", "date": "2026-12-02", "results": [one, two]}
    (tmp_path / "tp_7b_small.json").write_text(json.dumps(summary) + "\n")
    tables.tp_e2e_table(str(tmp_path), "7b", "_small")
    out = capsys.readouterr().out
    assert "| 8 | 100.0 | 180.0 | 1.80x | 5.0 / 3.0 ms | 50 / 30 ms | - |" in out
    assert ("Time to first token, 4 prompts x 64 tokens at once (max_num_batched_tokens 256): "
            "TP=1 1.500 s, TP=2 0.600 s (2.50x)") in out
