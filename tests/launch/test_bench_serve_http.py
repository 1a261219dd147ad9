"""``tprun bench serve`` (run as users run it, ``python -m launch``)
against a real ``tprun serve --model tiny --device cpu --http-port``,
bound to 127.0.0.1: the tokens it reports are the tokens the server
counted (``/metrics``: prefix caching off, so every prompt token is
scheduled), each request's TTFT is within its E2EL, and a server that
refuses every request (a model name it does not serve) gives failed
requests and vLLM's exit codes, not a crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.http_utils import metric, serving_tiny
from tests.helpers.proc_utils import ROOT, pythonpath

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 8, 24, 6


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("bench-serve"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats",
                      "--no-enable-prefix-caching") as served:
        yield served


def _bench(server, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``tprun bench serve`` at ``server`` (its tiny model's tokenizer by
    its cache); the process and the result JSON it saved, if any."""
    result = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=pythonpath(),
               TPRUN_CACHE=os.path.dirname(server.model_dir))
    proc = subprocess.run(
        [sys.executable, "-m", "launch", "bench", "serve", "--base-url", server.url,
         "--disable-tqdm", "--save-result", "--save-detailed", "--result-filename",
         str(result), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    saved = json.loads(result.read_text()) if result.exists() else None
    return proc, saved


def _counters(server) -> tuple[float, float]:
    return (metric(server.url, "tprun:prompt_tokens_total"),
            metric(server.url, "tprun:generation_tokens_total"))


@pytest.mark.timeout(400)
def test_tokens_reported_are_the_servers_and_ttft_within_e2el(server, tmp_path):
    before = _counters(server)
    proc, saved = _bench(server, tmp_path, "--model", "tiny", "--tokenizer", server.model_dir,
                         "--random-input-len", str(INPUT_LEN), "--random-output-len",
                         str(OUTPUT_LEN), "--num-prompts", str(NUM_PROMPTS),
                         "--request-rate", "40", "--max-concurrency", "3", "--ignore-eos",
                         "--temperature", "0", "--num-warmups", "0",
                         "--percentile-metrics", "ttft,tpot,itl,e2el")
    after = _counters(server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    prompt_tokens, generated = after[0] - before[0], after[1] - before[1]
    assert (prompt_tokens, generated) == (NUM_PROMPTS * INPUT_LEN, NUM_PROMPTS * OUTPUT_LEN)
    assert (saved["completed"], saved["failed"]) == (NUM_PROMPTS, 0)
    assert (saved["total_input_tokens"], saved["total_output_tokens"]) == \
        (prompt_tokens, generated)
    assert saved["input_lens"] == [INPUT_LEN] * NUM_PROMPTS
    assert saved["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
    for ttft, itl, latency in zip(saved["ttfts"], saved["itls"], saved["latencies"]):
        assert 0 < ttft <= latency
        assert ttft + sum(itl) == pytest.approx(latency)
    assert 1 <= saved["max_concurrent_requests"] <= 3
    assert (saved["request_rate"], saved["max_concurrency"], saved["backend"]) == \
        (40.0, 3, "openai")
    lines = proc.stdout.splitlines()
    assert f"{'Successful requests:':<40} {NUM_PROMPTS:<10}" in lines
    assert f"{'Total generated tokens:':<40} {NUM_PROMPTS * OUTPUT_LEN:<10}" in lines
    assert any(line.startswith("P99 E2EL (ms):") for line in lines)


@pytest.mark.timeout(400)
def test_chat_endpoint_with_the_servers_first_model(server, tmp_path):
    before = _counters(server)
    proc, saved = _bench(server, tmp_path, "--backend", "openai-chat", "--endpoint",
                         "/v1/chat/completions", "--random-input-len", "16",
                         "--random-output-len", "5", "--num-prompts", "4")
    after = _counters(server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert saved["model_id"] == "tiny"
    assert (saved["completed"], saved["failed"]) == (4, 0)
    assert saved["total_output_tokens"] == after[1] - before[1] == 20
    # The chat template's tokens come on top of each prompt's 16.
    assert saved["total_input_tokens"] == after[0] - before[0] > 4 * 16


@pytest.mark.timeout(400)
def test_a_server_that_refuses_every_request_gives_all_failed(server, tmp_path):
    proc, saved = _bench(server, tmp_path, "--model", "no-such-model", "--tokenizer",
                         server.model_dir, "--random-input-len", "8", "--random-output-len",
                         "2", "--num-prompts", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert (saved["completed"], saved["failed"], saved["total_output_tokens"]) == (0, 4, 0)
    assert all(error.startswith("HTTP 404") for error in saved["errors"])
    lines = proc.stdout.splitlines()
    assert f"{'Successful requests:':<40} {0:<10}" in lines
    assert f"{'Failed requests:':<40} {4:<10}" in lines


@pytest.mark.timeout(400)
def test_a_ready_check_that_never_succeeds_is_an_error(server, tmp_path):
    proc, saved = _bench(server, tmp_path, "--model", "no-such-model", "--tokenizer",
                         server.model_dir, "--random-input-len", "8", "--num-prompts", "2",
                         "--ready-check-timeout-sec", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert saved is None and "Traceback" not in proc.stderr
    assert "tprun: error: initial test run failed" in proc.stderr
    assert "HTTP 404" in proc.stderr


@pytest.mark.timeout(400)
def test_custom_dataset_prompts_reach_the_server(server, tmp_path):
    """The custom file's prompts, as they are, counted by the server: bytes
    plus its BOS (the tiny tokenizer), in vLLM's seed-0 order."""
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "alpha"}\n{"prompt": "beta"}\n{"prompt": "gamma"}\n')
    before = _counters(server)
    proc, saved = _bench(server, tmp_path, "--model", "tiny", "--tokenizer", server.model_dir,
                         "--dataset-name", "custom", "--dataset-path", str(path),
                         "--skip-chat-template", "--custom-output-len", "3",
                         "--num-prompts", "3", "--temperature", "0")
    after = _counters(server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (saved["completed"], saved["failed"]) == (3, 0)
    assert sorted(saved["input_lens"]) == [5, 6, 6]
    assert saved["total_input_tokens"] == after[0] - before[0] == 17
    assert all(1 <= n <= 3 for n in saved["output_lens"])


@pytest.mark.timeout(400)
def test_a_ramped_run_with_probes_records_the_ramp_and_the_probes(server, tmp_path):
    """An exponential ramp from 10 to 40 requests per second over five
    requests (rates 10, 14.1, 20, 28.3, 40) with probes beside it: every
    request the server counted is the load's or a probe's, the result
    holds the ramp's fields and one rps event per whole rate from 10 to
    40, and the request rate stays inf."""
    before = _counters(server)
    proc, saved = _bench(server, tmp_path, "--model", "tiny", "--tokenizer", server.model_dir,
                         "--random-input-len", "8", "--random-output-len", "4",
                         "--num-prompts", "5", "--ramp-up-strategy", "exponential",
                         "--ramp-up-start-rps", "10", "--ramp-up-end-rps", "40",
                         "--probe-request-rate", "20", "--temperature", "0")
    after = _counters(server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (saved["completed"], saved["failed"]) == (5, 0)
    probes = saved["probe_completed"] + saved["probe_failed"]
    assert probes >= 1 and saved["probe_failed"] == 0
    # Each probe: one token asked for; each load request: 4 (ignore_eos).
    assert after[1] - before[1] == 5 * 4 + saved["probe_completed"]
    assert saved["total_output_tokens"] == 5 * 4
    assert (saved["ramp_up_strategy"], saved["ramp_up_start_rps"], saved["ramp_up_end_rps"],
            saved["request_rate"]) == ("exponential", 10, 40, "inf")
    assert [e["rps"] for e in saved["rps_change_events"]] == list(range(10, 41))
    assert "Traffic ramp-up strategy: exponential." in proc.stdout.splitlines()
