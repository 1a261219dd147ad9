"""``tprun bench``: the summary's fields and figures, checked against what
the run must have done (request counts, token totals), and the latency
arithmetic against hand-computed values."""

from __future__ import annotations

import json

import pytest

from engine.bench import BenchConfig, _Timing, dataset_requests, latencies, percentiles
from tests.helpers.proc_utils import run_tprun

SUMMARY_KEYS = {"num_requests", "duration_s", "requests_per_s", "output_tokens_per_s",
                "total_tokens_per_s", "total_input_tokens", "total_output_tokens",
                "ttft_ms", "itl_ms", "engine", "spec_decode"}


def run_bench(tmp_path, *args: str, timeout: float = 100):
    result, leftovers = run_tprun(list(args), timeout=timeout,
                                  env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert leftovers == []
    return result


def check_summary(s: dict, num_requests: int, input_tokens: int, output_tokens: int) -> None:
    assert set(s) == SUMMARY_KEYS
    assert s["spec_decode"] is None  # no speculative_config in these runs
    assert s["num_requests"] == num_requests
    assert s["total_input_tokens"] == input_tokens
    assert s["total_output_tokens"] == output_tokens
    duration = s["duration_s"]
    assert duration > 0
    assert s["requests_per_s"] == pytest.approx(num_requests / duration)
    assert s["output_tokens_per_s"] == pytest.approx(output_tokens / duration)
    assert s["total_tokens_per_s"] == pytest.approx((input_tokens + output_tokens) / duration)
    for name in ("ttft_ms", "itl_ms"):
        p = s[name]
        assert set(p) == {"mean", "p50", "p90", "p99"}
        assert 0 < p["p50"] <= p["p90"] <= p["p99"] <= duration * 1000
        assert 0 < p["mean"] <= duration * 1000


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_json_random_prompts_tp1(tmp_path):
    result = run_bench(tmp_path, "--nproc-per-node", "1", "bench", "--model", "tiny",
                       "--device", "cpu", "--num-prompts", "6", "--input-len", "12",
                       "--output-len", "5", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    check_summary(summary, 6, 6 * 12, 6 * 5)
    engine = summary["engine"]
    assert engine["async_scheduling"] is True and engine["tensor_parallel_size"] == 1
    assert engine["num_steps"] >= 5 and engine["num_preemptions"] == 0
    assert "bench" in result.stderr and "6/6" in result.stderr  # the progress bar


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_dataset_tp2_sync_and_table(tmp_path):
    dataset = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "Hello, my name is"}, {"prompt_token_ids": [1, 2, 3, 4], "max_tokens": 3},
             {"prompt": "héllo", "max_tokens": 7}]
    dataset.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    result = run_bench(tmp_path, "--nproc-per-node", "2", "bench", "--model", "tiny",
                       "--device", "cpu", "--dataset", str(dataset), "--output-len", "4",
                       "--no-async-scheduling", "--no-warmup")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "requests: 3 in" in out and "TP=2, async scheduling off" in out
    assert "throughput:" in out and "TTFT ms:" in out and "ITL ms:" in out
    assert len(dataset_requests(str(dataset), 4)) == 3  # the blank line is skipped
    result = run_bench(tmp_path, "--nproc-per-node", "2", "bench", "--model", "tiny",
                       "--device", "cpu", "--dataset", str(dataset), "--output-len", "4",
                       "--json", "--no-warmup")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    # Text prompts: <s> + one token per UTF-8 byte (the tiny byte tokenizer).
    check_summary(summary, 3, (1 + 17) + 4 + (1 + 6), 4 + 3 + 7)
    assert summary["engine"]["tensor_parallel_size"] == 2


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_bad_dataset_line_is_a_clear_error(tmp_path):
    dataset = tmp_path / "bad.jsonl"
    dataset.write_text('{"prompt": "ok"}\n{"prompt": "a", "prompt_token_ids": [1]}\n')
    result = run_bench(tmp_path, "--nproc-per-node", "1", "bench", "--model", "tiny",
                       "--device", "cpu", "--dataset", str(dataset), "--json")
    # The user's input: exit code 2, one line, before the model loads.
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"tprun: error: {dataset}:2: give exactly one of \"prompt\" and \"prompt_token_ids\""]
    too_long = tmp_path / "long.jsonl"
    too_long.write_text(json.dumps({"prompt_token_ids": [1] * 5000}) + "\n")
    result = run_bench(tmp_path, "--nproc-per-node", "1", "bench", "--model", "tiny",
                       "--device", "cpu", "--dataset", str(too_long), "--no-warmup")
    assert result.returncode == 2, result.stderr
    assert "exceeds max_model_len 4096" in result.stderr.strip().splitlines()[-1]


def test_latencies_from_delta_times():
    timings = {
        "a": _Timing(start=10.0, num_prompt_tokens=3,
                     arrivals=[(10.5, 1), (10.7, 1), (11.3, 2)]),
        "b": _Timing(start=10.0, num_prompt_tokens=3, arrivals=[(12.0, 1)]),
    }
    ttft, itl = latencies(timings)
    assert ttft == pytest.approx([0.5, 2.0])
    assert itl == pytest.approx([0.2, 0.3, 0.3])  # a 2-token delta shares its gap
    p = percentiles([0.001 * i for i in range(1, 101)])
    assert p["mean"] == pytest.approx(50.5)
    assert p["p50"] == pytest.approx(50.5) and p["p99"] == pytest.approx(99.01)
    assert percentiles([]) == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_bench_config_is_validated():
    with pytest.raises(ValueError, match="num_prompts"):
        BenchConfig(num_prompts=0)
    with pytest.raises(ValueError, match="temperature"):
        BenchConfig(temperature=-1.0)


@pytest.mark.timeout(120)
def test_the_dataset_is_read_once_when_the_config_is_made(tmp_path):
    """One code path reads a dataset: BenchConfig, when it is made (a bad line
    is refused there, before any engine exists); run_bench runs what it read,
    so the file may be gone by then."""
    from engine.bench import BenchRequest, run_bench
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=f"^{bad}:2: each line must be a JSON object$"):
        BenchConfig(dataset=str(bad))
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text(json.dumps({"prompt_token_ids": [5, 6, 7]}) + "\n"
                       + json.dumps({"prompt_token_ids": [8, 9], "max_tokens": 2}) + "\n")
    config = BenchConfig(dataset=str(dataset), output_len=3, warmup=False)
    assert config.from_dataset == (BenchRequest({"prompt_token_ids": [5, 6, 7]}, 3),
                                   BenchRequest({"prompt_token_ids": [8, 9]}, 2))
    dataset.unlink()
    engine = LLMEngine(EngineConfig(model="tiny", device="cpu"))
    try:
        summary = run_bench(engine, config, progress=False)
    finally:
        engine.shutdown()
    assert summary["num_requests"] == 2
    assert summary["total_input_tokens"] == 3 + 2 and summary["total_output_tokens"] == 3 + 2
