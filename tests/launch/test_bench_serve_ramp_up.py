"""``tprun bench serve``'s request-rate ramp-up (``--ramp-up-strategy``):
each request's rate and send offset against values worked by hand
(linear 1 to 5 and exponential 1 to 16 requests per second over five
requests, at an infinite burstiness, where each gap is exactly one over
the rate), the gamma draws of a seed against numpy's standard gamma
draws scaled by hand, the wait loop on a fake clock (no real time), the
``rps_change_events`` record, the result file's default name, and the
option checks: one ``tprun: error:`` line, exit code 2, before any
request reaches the server."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import datetime

import numpy as np
import pytest

from checkpoint.tiny_model import ensure_tiny_model
from launch.bench_serve.arrivals import arrival_offsets, arrive
from launch.bench_serve.ramp_up import RampUp, RpsChanges, ramp_up_from_args
from launch.bench_serve.run import result_filename
from launch.cli import main
from tests.helpers.sse_stand_in import StandIn, event, running, token, usage

INF = float("inf")


def test_linear_ramp_rates_and_offsets_worked_by_hand():
    ramp = RampUp("linear", 1, 5)
    # Progress i / 4: rates 1, 2, 3, 4, 5; gaps 1/rate; offsets their sums.
    assert ramp.rates(5) == pytest.approx([1, 2, 3, 4, 5])
    assert arrival_offsets(5, INF, INF, 0, ramp) == pytest.approx(
        [1, 1 + 1 / 2, 1 + 1 / 2 + 1 / 3, 1 + 1 / 2 + 1 / 3 + 1 / 4,
         1 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5], rel=1e-12)


def test_exponential_ramp_rates_and_offsets_worked_by_hand():
    ramp = RampUp("exponential", 1, 16)
    # 16 ** (i / 4): 1, 2, 4, 8, 16 requests per second.
    assert ramp.rates(5) == pytest.approx([1, 2, 4, 8, 16])
    assert arrival_offsets(5, INF, INF, 0, ramp) == pytest.approx(
        [1, 1.5, 1.75, 1.875, 1.9375], rel=1e-12)


def test_a_ramp_of_one_request_stays_at_the_start_and_equal_ends_are_constant():
    assert RampUp("linear", 3, 9).rates(1) == [3]
    assert RampUp("exponential", 3, 9).rates(1) == [3]
    assert arrival_offsets(4, INF, INF, 0, RampUp("exponential", 2, 2)) == pytest.approx(
        [0.5, 1.0, 1.5, 2.0])


def test_ramped_gaps_are_the_seeds_gamma_draws_at_each_rate_unstretched():
    """numpy's legacy gamma(shape k, scale s) is s times its standard
    gamma(k): the same draws, scaled by hand to each request's rate."""
    n, burstiness, seed = 6, 0.5, 11
    ramp = RampUp("linear", 2, 12)
    standard = np.random.RandomState(seed).standard_gamma(burstiness, size=n)
    rates = [2, 4, 6, 8, 10, 12]
    reference = np.cumsum([g / (r * burstiness) for g, r in zip(standard, rates)])
    offsets = arrival_offsets(n, INF, burstiness, seed, ramp)
    assert offsets == pytest.approx(list(reference), rel=1e-12)
    # Poisson (burstiness 1): exponential draws of mean 1 / rate.
    exp = np.random.RandomState(seed).standard_exponential(size=n)
    assert arrival_offsets(n, INF, 1.0, seed, ramp) == pytest.approx(
        list(np.cumsum([e / r for e, r in zip(exp, rates)])), rel=1e-12)


def test_the_wait_loop_sends_each_item_at_its_offset_on_a_fake_clock():
    now = [100.0]
    slept, sent = [], []

    async def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    async def go():
        offsets = arrival_offsets(5, INF, INF, 0, RampUp("linear", 1, 5))
        async for item in arrive(list("abcde"), offsets, clock=lambda: now[0], sleep=sleep):
            sent.append((item, now[0] - 100.0))
            if item == "b":
                now[0] += 0.5  # the consumer ran late: c is already due

    asyncio.run(go())
    expected = [1, 1.5, 1 + 1 / 2 + 1 / 3, 1 + 1 / 2 + 1 / 3 + 1 / 4,
                1 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5]
    assert [item for item, _ in sent] == list("abcde")
    assert [t for _, t in sent] == pytest.approx([1, 1.5, 2.0, expected[3], expected[4]])
    assert len(slept) == 4  # none for c, sent as soon as it was asked for


def test_rps_change_events_list_every_whole_rate_passed_with_its_stamp():
    changes = RpsChanges()
    changes.start(1, "t0")
    for i, rate in enumerate(RampUp("exponential", 1, 16).rates(5)):
        changes.sent(rate, f"t{i + 1}")
    assert changes.events == (
        [{"rps": 1, "timestamp": "t0"}, {"rps": 2, "timestamp": "t2"}]
        + [{"rps": r, "timestamp": "t3"} for r in (3, 4)]
        + [{"rps": r, "timestamp": "t4"} for r in range(5, 9)]
        + [{"rps": r, "timestamp": "t5"} for r in range(9, 17)])


def test_linear_rates_below_the_next_whole_rate_record_nothing():
    changes = RpsChanges()
    changes.start(1, "t0")
    for i, rate in enumerate(RampUp("linear", 1, 2).rates(4)):  # 1, 1.33, 1.67, 2
        changes.sent(rate, f"t{i + 1}")
    assert changes.events == [{"rps": 1, "timestamp": "t0"}, {"rps": 2, "timestamp": "t4"}]


def test_the_default_result_name_carries_the_ramp():
    args = argparse.Namespace(max_concurrency=4, result_filename=None, label=None,
                              backend="openai", request_rate=INF, ramp_up_strategy="linear",
                              ramp_up_start_rps=1, ramp_up_end_rps=5, result_dir=None)
    assert result_filename(args, "org/m", "D") == \
        "openai-ramp-up-linear-1qps-5qps-concurrency4-m-D.json"
    args.ramp_up_strategy = None
    assert result_filename(args, "org/m", "D") == "openai-infqps-concurrency4-m-D.json"


@pytest.mark.parametrize(("given", "message"), [
    (("exponential", 1, 4, 3.0), "--ramp-up-strategy sets the request rate of every request: "
     "leave out --request-rate (got 3)"),
    (("linear", 1, None, INF), "--ramp-up-strategy needs both --ramp-up-start-rps and "
     "--ramp-up-end-rps"),
    (("linear", -1, 4, INF), "--ramp-up-start-rps and --ramp-up-end-rps must be at least 0"),
    (("linear", 5, 4, INF), "--ramp-up-start-rps (5) must be at most --ramp-up-end-rps (4)"),
    (("exponential", 0, 4, INF), "--ramp-up-start-rps must be at least 1"),
    (("linear", 0, 4, INF), "--ramp-up-start-rps must be at least 1"),
    ((None, 2, None, INF), "--ramp-up-start-rps applies only with --ramp-up-strategy"),
    ((None, 2, 3, 5.0), "--ramp-up-start-rps and --ramp-up-end-rps apply only with"),
])
def test_ramp_checks(given, message):
    with pytest.raises(ValueError) as refused:
        ramp_up_from_args(*given)
    assert str(refused.value).startswith(message)


def test_no_ramp_options_is_a_fixed_rate():
    assert ramp_up_from_args(None, None, None, 3.0) is None
    assert ramp_up_from_args("linear", 2, 2, INF) == RampUp("linear", 2, 2)


def _three_tokens(i, body):
    return [(event(token("x")), 0.0)] * 3 + [(event(usage(8, 3)) + event("[DONE]"), 0.0)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("argv", "message"), [
    (("--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5",
      "--request-rate", "4"), "--ramp-up-strategy sets the request rate of every request"),
    (("--ramp-up-strategy", "linear", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "5"),
     "--ramp-up-start-rps must be at least 1"),
    (("--ramp-up-strategy", "exponential", "--ramp-up-end-rps", "5"),
     "--ramp-up-strategy needs both"),
    (("--ramp-up-end-rps", "5",), "--ramp-up-end-rps applies only with --ramp-up-strategy"),
])
def test_a_bad_ramp_is_one_error_line_before_any_request(tmp_path, capsys, argv, message):
    stand_in = StandIn(_three_tokens)
    result = tmp_path / "result.json"
    with running(stand_in) as url:
        code = main(["bench", "serve", "--base-url", url, "--model", "m", "--tokenizer",
                     ensure_tiny_model(), "--random-input-len", "8", "--random-output-len",
                     "3", "--num-prompts", "2", "--num-warmups", "2",
                     "--ready-check-timeout-sec", "5", "--disable-tqdm", "--save-result",
                     "--result-filename", str(result), *argv])
    captured = capsys.readouterr()
    assert code == 2 and not result.exists() and stand_in.requests == []
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tprun: error: {message}")


@pytest.mark.timeout(120)
def test_a_ramped_run_sends_every_request_and_records_the_ramp(tmp_path, capsys):
    """Against the stand-in server: the ramp's fields in the result JSON,
    the request rate left at inf, one rps event per whole rate from the
    start to the end, stamped in send order."""
    stand_in = StandIn(_three_tokens)
    result = tmp_path / "result.json"
    with running(stand_in) as url:
        code = main(["bench", "serve", "--base-url", url, "--model", "m", "--tokenizer",
                     ensure_tiny_model(), "--random-input-len", "8", "--random-output-len",
                     "3", "--num-prompts", "4", "--ramp-up-strategy", "linear",
                     "--ramp-up-start-rps", "20", "--ramp-up-end-rps", "40",
                     "--disable-tqdm", "--save-result", "--result-filename", str(result)])
    out = capsys.readouterr().out
    assert code == 0
    saved = json.loads(result.read_text())
    assert (saved["completed"], saved["failed"], len(stand_in.requests)) == (4, 0, 4)
    assert (saved["ramp_up_strategy"], saved["ramp_up_start_rps"], saved["ramp_up_end_rps"],
            saved["request_rate"]) == ("linear", 20, 40, "inf")
    # Rates 20, 26.7, 33.3, 40: every whole rate from 20 to 40 once.
    events = saved["rps_change_events"]
    assert [e["rps"] for e in events] == list(range(20, 41))
    stamps = [datetime.fromisoformat(e["timestamp"]) for e in events]
    assert stamps == sorted(stamps)
    assert "Traffic ramp-up strategy: linear." in out.splitlines()
    assert "Request rate configured (RPS):" not in out
