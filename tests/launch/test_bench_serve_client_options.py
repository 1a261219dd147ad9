"""``tprun bench serve``'s client options beyond the load itself, each
against the stand-in server (``tests.helpers.sse_stand_in``) or worked
values: ``--lora-modules`` / ``--lora-assignment`` (the model each
request names), ``--probe-request-rate`` (one-token probes beside the
load, outside ``--max-concurrency``, reported apart), ``--insecure`` (an
https server with a self-signed certificate) and
``--chat-template-kwargs`` (the template's variables). Counts, names and
orders only: no wall-clock asserts."""

from __future__ import annotations

import asyncio
import copy
import ssl
import subprocess

import pytest

from checkpoint.tiny_model import ensure_tiny_model
from checkpoint.tokenizer import Tokenizer
from launch.bench_serve.custom_dataset import custom_requests
from launch.bench_serve.lora_assignment import lora_names
from launch.bench_serve.probe import probe_loop, probe_stats
from launch.bench_serve.request import RequestOutput
from launch.cli import main
from tests.helpers.bench_runs import bench
from tests.helpers.sse_stand_in import StandIn, event, running, token, usage


def _answer(pause: float = 0.0):
    def answer(i, body):
        return [(event(token("x")), pause)] * 3 + [(event(usage(8, 3)) + event("[DONE]"), 0.0)]

    return answer


def test_round_robin_names_each_adapter_in_turn():
    assert lora_names(["a", "b", "c"], 5, "round-robin", 0) == ["a", "b", "c", "a", "b"]


def test_random_names_are_the_seeds_and_cover_the_adapters():
    names = lora_names(["a", "b", "c"], 200, "random", 4)
    assert names == lora_names(["a", "b", "c"], 200, "random", 4)
    assert names != lora_names(["a", "b", "c"], 200, "random", 5)
    assert set(names) == {"a", "b", "c"}


@pytest.mark.timeout(120)
def test_each_request_names_its_adapter_and_warm_ups_the_base_model(tmp_path):
    stand_in = StandIn(_answer())
    with running(stand_in) as url:
        code, saved = bench(url, tmp_path, "--num-prompts", "5", "--max-concurrency", "1",
                             "--num-warmups", "1", "--lora-modules", "a", "b", "c",
                             "--lora-assignment", "round-robin", "--request-id-prefix", "r-")
    assert code == 0 and saved["completed"] == 5
    warm_up, *measured = stand_in.requests
    assert warm_up["body"]["model"] == "m" and "x-request-id" not in warm_up["headers"]
    by_id = {r["headers"]["x-request-id"]: r["body"]["model"] for r in measured}
    assert by_id == {"r-0": "a", "r-1": "b", "r-2": "c", "r-3": "a", "r-4": "b"}


def _ok(latency: float) -> RequestOutput:
    return RequestOutput(success=True, latency=latency, ttft=latency)


def test_probe_stats_worked_by_hand_and_none_without_a_success():
    stats = probe_stats([_ok(0.1), _ok(0.3), RequestOutput(error="x"), _ok(0.2)])
    # P99 of 100, 200, 300: numpy's linear interpolation at rank 0.99 * 2 = 1.98.
    assert stats == pytest.approx({"probe_completed": 3, "probe_failed": 1,
                                   "probe_median_e2el_ms": 200.0,
                                   "probe_p99_e2el_ms": 298.0, "probe_max_e2el_ms": 300.0})
    assert probe_stats([RequestOutput(error="x")]) is None and probe_stats([]) is None


@pytest.mark.timeout(30)
def test_the_probe_loop_ends_its_pause_when_stopped():
    """A pause of 1000 s (rate 0.001) ends as soon as the run stops."""
    async def go():
        stop = asyncio.Event()
        sent = []

        async def send():
            sent.append(1)
            if len(sent) == 2:
                asyncio.get_running_loop().call_soon(stop.set)
            return _ok(0.01)

        fast = await probe_loop(send, 1e6, stop)
        stop.clear()
        sent.clear()
        asyncio.get_running_loop().call_later(0.05, stop.set)
        slow = await probe_loop(send, 0.001, stop)
        return fast, slow

    fast, slow = asyncio.run(go())
    assert len(fast) == 2 and len(slow) == 1


@pytest.mark.timeout(120)
def test_probes_run_beside_the_load_outside_the_concurrency_limit(tmp_path, capsys):
    """``barrier=2``: the server answers nothing before two requests have
    arrived. Under --max-concurrency 1 the second can only be a probe: a
    probe queued behind the limit would leave the run stuck."""
    stand_in = StandIn(_answer(0.02), barrier=2)
    with running(stand_in) as url:
        code, saved = bench(url, tmp_path, "--num-prompts", "3", "--max-concurrency", "1",
                             "--probe-request-rate", "50", "--request-id-prefix", "r-")
    out = capsys.readouterr().out
    assert code == 0 and (saved["completed"], saved["failed"]) == (3, 0)
    probes = [r for r in stand_in.requests if "x-request-id" not in r["headers"]]
    assert len(probes) == saved["probe_completed"] + saved["probe_failed"] >= 1
    assert saved["probe_failed"] == 0
    assert {(p["body"]["prompt"], p["body"]["max_tokens"]) for p in probes} == {("Hi", 1)}
    assert len(stand_in.requests) - len(probes) == 3  # the load's own requests
    assert saved["probe_max_e2el_ms"] >= saved["probe_median_e2el_ms"] > 0
    lines = out.splitlines()
    assert f"{'Probe Requests':-^50}" in lines
    assert f"{'Probe requests completed:':<40} {saved['probe_completed']:<10}" in lines


@pytest.mark.timeout(60)
def test_a_negative_probe_rate_is_refused_before_any_request(tmp_path, capsys):
    stand_in = StandIn(_answer())
    with running(stand_in) as url:
        code, saved = bench(url, tmp_path, "--num-prompts", "1", "--probe-request-rate", "-1")
    assert code == 2 and saved is None and stand_in.requests == []
    assert capsys.readouterr().err.startswith("tprun: error: --probe-request-rate must be")


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory) -> ssl.SSLContext:
    where = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(where / "key.pem"), "-out",
                    str(where / "cert.pem")], check=True, capture_output=True, timeout=60)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(where / "cert.pem", where / "key.pem")
    return context


@pytest.mark.timeout(120)
def test_insecure_reaches_an_https_server_with_a_self_signed_certificate(tmp_path,
                                                                         self_signed):
    with running(StandIn(_answer()), tls=self_signed) as url:
        assert url.startswith("https://")
        checked_code, checked = bench(url, tmp_path, "--num-prompts", "2")
        code, saved = bench(url, tmp_path, "--num-prompts", "2", "--insecure")
    assert checked_code == 0 and (checked["completed"], checked["failed"]) == (0, 2)
    assert all("certificate" in error.lower() for error in checked["errors"])
    assert code == 0 and (saved["completed"], saved["failed"]) == (2, 0)


def test_chat_template_kwargs_reach_the_template():
    tokenizer = copy.copy(Tokenizer.from_dir(ensure_tiny_model()))
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                               "{% if flavor %}[{{ flavor }}]{% endif %}")
    plain = custom_requests(["alpha"], tokenizer, 1, shuffle=False)
    flavored = custom_requests(["alpha"], tokenizer, 1, shuffle=False,
                               chat_template_kwargs={"flavor": "mint"})
    assert (plain[0].prompt, flavored[0].prompt) == ("alpha", "alpha[mint]")


@pytest.mark.timeout(60)
def test_chat_template_kwargs_must_be_a_json_object(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["bench", "serve", "--chat-template-kwargs", "[1]"])
    assert stopped.value.code == 2 and "--chat-template-kwargs" in capsys.readouterr().err
