"""``tprun bench serve``'s arithmetic, against hand-worked references:
arrival offsets against numpy's own exponential and gamma draws of the
same seed, the metric formulas (TTFT, TPOT without the first token, ITL
per chunk, E2EL, percentiles, peaks, goodput) against timestamps worked
by hand, the random dataset's lengths against numpy's draws, and the
summary's names (vLLM's)."""

from __future__ import annotations

import numpy as np
import pytest

from checkpoint.tiny_model import ensure_tiny_model
from checkpoint.tokenizer import Tokenizer
from launch.bench_serve.arrivals import arrival_offsets
from launch.bench_serve.metrics import calculate_metrics, peak_concurrency
from launch.bench_serve.random_dataset import random_requests
from launch.bench_serve.report import (
    metric_distributions,
    result_fields,
    selected_blocks,
    summary_lines,
)
from launch.bench_serve.request import RequestInput, RequestOutput, request_body


def _stretched(gaps, n, rate):
    """The running sums of ``gaps``, scaled so the last is n / rate."""
    sums = np.cumsum(gaps)
    return list(sums * (n / rate) / sums[-1])


def test_poisson_arrivals_are_numpys_exponential_draws_of_the_seed():
    n, rate, seed = 6, 4.0, 7
    reference = _stretched(np.random.RandomState(seed).exponential(1 / rate, size=n), n, rate)
    offsets = arrival_offsets(n, rate, 1.0, seed)
    assert offsets == pytest.approx(reference, rel=1e-12)
    assert offsets[-1] == pytest.approx(n / rate)
    assert offsets != arrival_offsets(n, rate, 1.0, seed + 1)


def test_bursty_arrivals_are_numpys_gamma_draws_of_the_seed():
    n, rate, burstiness, seed = 8, 10.0, 0.5, 3
    gaps = np.random.RandomState(seed).gamma(burstiness, 1 / (rate * burstiness), size=n)
    assert arrival_offsets(n, rate, burstiness, seed) == pytest.approx(
        _stretched(gaps, n, rate), rel=1e-12)


def test_infinite_rate_sends_all_at_once_and_infinite_burstiness_evenly():
    assert arrival_offsets(4, float("inf"), 1.0, 0) == [0.0] * 4
    assert arrival_offsets(4, 2.0, float("inf"), 0) == pytest.approx([0.5, 1.0, 1.5, 2.0])
    with pytest.raises(ValueError, match="burstiness"):
        arrival_offsets(4, 2.0, 0.0, 0)


def _out(start, ttft, itl, tokens, prompt_len=10, text=""):
    return RequestOutput(generated_text=text, success=True, start_time=start, ttft=ttft,
                         itl=list(itl), latency=ttft + sum(itl), output_tokens=tokens,
                         prompt_len=prompt_len)


# A: 4 tokens in 4 chunks; B: 3 tokens in 2 chunks (one chunk of two);
# C failed; D one token.
OUTPUTS = [_out(10.0, 0.1, [0.02, 0.03, 0.05], 4), _out(10.05, 0.3, [0.1], 3, prompt_len=20),
           RequestOutput(success=False, error="HTTP 404", prompt_len=99),
           _out(11.5, 0.05, [], 1)]


def test_metrics_against_hand_worked_timestamps():
    m = calculate_metrics(OUTPUTS, 2.0, count_tokens=len, percentiles=[50, 99],
                          goodput={"ttft": 150})
    assert (m.completed, m.failed, m.total_input, m.total_output) == (3, 1, 40, 8)
    assert m.output_lens == [4, 3, 0, 1]
    assert (m.request_throughput, m.output_throughput, m.total_token_throughput) == \
        pytest.approx((1.5, 4.0, 24.0))
    # TTFT ms [100, 300, 50]: sorted [50, 100, 300]; p99 at rank 1.98.
    assert (m.ttft.mean, m.ttft.median) == pytest.approx((150.0, 100.0))
    assert m.ttft.std == pytest.approx((35000 / 3) ** 0.5)
    assert [p for p, _ in m.ttft.percentiles] == [50, 99]
    assert [v for _, v in m.ttft.percentiles] == pytest.approx([100.0, 100 + 0.98 * 200])
    # TPOT: A (200 - 100) / 3, B (400 - 300) / 2; D (one token) has none.
    assert (m.tpot.mean, m.tpot.median) == pytest.approx(((100 / 3 + 50) / 2,) * 2)
    assert m.tpot.percentiles[1][1] == pytest.approx(100 / 3 + 0.99 * (50 - 100 / 3))
    # ITL: every gap between chunks, pooled: [20, 30, 50, 100].
    assert (m.itl.mean, m.itl.median) == pytest.approx((50.0, 40.0))
    assert m.itl.percentiles[1][1] == pytest.approx(50 + 0.97 * 50)
    # E2EL [200, 400, 50].
    assert (m.e2el.mean, m.e2el.median) == pytest.approx((650 / 3, 200.0))
    # A [10.0, 10.2) and B [10.05, 10.45) overlap; D alone.
    assert m.max_concurrent_requests == 2
    # Chunks at 10.1 10.12 10.15 10.2 (A), 10.35 10.45 (B): second 0; 11.55 (D): second 1.
    assert m.max_output_tokens_per_s == 6.0
    # TTFT within 150 ms: A and D, over 2 s.
    assert m.request_goodput == pytest.approx(1.0)


def test_output_tokens_counted_from_text_without_usage_and_no_success_gives_zeros():
    m = calculate_metrics([_out(0.0, 0.1, [0.1], 0, text="abcde")], 1.0, count_tokens=len,
                          percentiles=[99])
    assert m.total_output == 5
    assert m.tpot.mean == pytest.approx(100 / 4)
    failed = calculate_metrics([RequestOutput(error="x")] * 3, 1.0, len, [99])
    assert (failed.completed, failed.failed, failed.ttft.mean, failed.ttft.percentiles) == \
        (0, 3, 0.0, [(99, 0.0)])


def test_requests_that_touch_do_not_overlap():
    assert peak_concurrency([_out(0.0, 0.5, [0.5], 2), _out(1.0, 0.5, [], 1)]) == 1


def test_summary_and_result_names_are_vllms():
    m = calculate_metrics(OUTPUTS, 2.0, len, [50, 99.9])
    blocks = {"ttft": m.ttft, "e2el": m.e2el}
    lines = summary_lines(m, 2.0, None, float("inf"), False, blocks)
    assert lines[0] == "=" * 12 + " Serving Benchmark Result " + "=" * 12
    assert lines[1] == f"{'Successful requests:':<40} {3:<10}"
    assert not any("Request rate configured" in line for line in lines)
    assert f"{'P99.9 TTFT (ms):':<40} {m.ttft.percentiles[1][1]:<10.2f}" in lines
    assert "-" * 15 + "Time to First Token" + "-" * 16 in lines
    assert any(line.startswith("Median E2EL (ms):") for line in lines)
    assert any("Request rate configured (RPS):" in line
               for line in summary_lines(m, 2.0, 4, 3.0, False, blocks))
    result = result_fields(m, OUTPUTS, 2.0, False, blocks)
    assert {"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99.9_ttft_ms",
            "p99.9_e2el_ms", "completed", "failed", "total_input_tokens",
            "total_output_tokens", "request_throughput", "output_throughput",
            "total_token_throughput", "ttfts", "itls", "latencies", "errors",
            "max_concurrent_requests"} <= result.keys()
    assert result["request_goodput"] is None and result["failed"] == 1


def test_metric_blocks_come_in_vllms_order_whatever_the_order_given():
    m = calculate_metrics(OUTPUTS, 2.0, len, [99])
    found = metric_distributions(m, OUTPUTS, [99], 4, 3.0)
    blocks = selected_blocks(found, ["e2el_including_client_queue", "e2el", "itl", "ttft",
                                     "client_queue_time"])
    assert list(blocks) == ["ttft", "itl", "e2el", "client_queue_time",
                            "e2el_including_client_queue"]
    titles = [line for line in summary_lines(m, 2.0, 4, 3.0, False, blocks)
              if line.startswith("---")]
    assert [t.strip("-") for t in titles] == [
        "Time to First Token", "Inter-token Latency", "End-to-end Latency",
        "Client-side Queueing", "Queue-inclusive End-to-end Latency"]
    # Without a concurrency limit vLLM has no queue blocks to show.
    assert list(selected_blocks(metric_distributions(m, OUTPUTS, [99], None, 3.0),
                                ["client_queue_time", "tpot"])) == ["tpot"]


def test_request_bodies_are_vllms():
    given = RequestInput(prompt="hi", api_url="u", prompt_len=1, output_len=5, model="m",
                         ignore_eos=True, extra_body={"temperature": 0.0})
    body = request_body("openai", given)
    assert (body["prompt"], body["max_tokens"], body["stream"], body["ignore_eos"],
            body["temperature"], body["stream_options"]) == \
        ("hi", 5, True, True, 0.0, {"include_usage": True})
    chat = request_body("openai-chat", given)
    assert chat["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert chat["max_completion_tokens"] == 5 and "prompt" not in chat


def test_random_dataset_lengths_are_numpys_draws_and_the_text_encodes_to_them():
    tokenizer = Tokenizer.from_dir(ensure_tiny_model())  # adds a BOS to every text
    n, seed = 12, 5
    requests = random_requests(tokenizer, n, input_len=21, output_len=8, range_ratio=0.5,
                               seed=seed)
    rng = np.random.default_rng(seed)
    own = rng.integers(10, 31, size=n)  # 20 own tokens: [floor(10), ceil(30)]
    outputs = rng.integers(4, 13, size=n)
    assert [r.prompt_len for r in requests] == list(own + 1)
    assert [r.expected_output_len for r in requests] == list(outputs)
    assert [len(tokenizer.encode(r.prompt)) for r in requests] == list(own + 1)
    again = random_requests(tokenizer, n, input_len=21, output_len=8, range_ratio=0.5,
                            seed=seed)
    assert [r.prompt for r in again] == [r.prompt for r in requests]
    assert len({r.prompt for r in requests}) == n
