"""The engine over IPC: ``tprun serve`` (TP=2, a subprocess) and ``EngineClient``.

Every answer is checked against an independent reference: the same prompts
through the in-process ``LLM`` (greedy). The server is started once for
the module in its own session; its shutdown (SIGTERM: exit code 0, no
process, socket or endpoint file left) is checked when the module ends.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import msgspec
import pytest
import zmq

from engine import LLM, SamplingParams
from engine.client import EngineClient, EngineStoppedError
from ipc.engine_messages import (
    GenerateRequest,
    RequestAccepted,
    RequestError,
    decode_server_message,
    encode,
)
from tests.proc_utils import ROOT, session_pids

MAX_TOKENS = 4


def start_server(tmp_path, *args: str) -> tuple[subprocess.Popen, str]:
    """Start ``tprun ... serve`` in its own session; wait for its endpoint file."""
    endpoint_file = str(tmp_path / "endpoint")
    env = dict(os.environ, PYTHONPATH=ROOT, TPRUN_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", *args, "--endpoint-file", endpoint_file],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 90
    while not os.path.exists(endpoint_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            pytest.fail(f"tprun serve did not start:\n{proc.stderr.read()}")
        time.sleep(0.1)
    with open(endpoint_file) as f:
        return proc, f.read().strip()


def stop_server(proc: subprocess.Popen) -> tuple[int, str, list[int]]:
    """SIGTERM the server; returns (exit code, stdout + stderr, leftover
    pids). Any process of its session still alive after 10 s is killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    out += err
    deadline = time.monotonic() + 10
    while session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftovers = session_pids(proc.pid)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    return proc.returncode, out, leftovers


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("serve")
    proc, endpoint = start_server(tmp_path, "--nproc-per-node", "2", "serve", "--model",
                                  "tiny", "--device", "cpu", "--disable-log-stats")
    yield endpoint, str(tmp_path / "endpoint")
    code, out, leftovers = stop_server(proc)
    assert code == 0, out
    assert f"engine endpoint {endpoint}" in out
    assert leftovers == []
    assert not os.path.exists(tmp_path / "endpoint")
    assert not os.path.exists(os.path.dirname(endpoint[len("ipc://"):]))


def make_prompts(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(1, 256) for _ in range(rng.randint(3, 40))]}
            for _ in range(n)]


def reference(prompts: list[dict], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with LLM(model="tiny", device="cpu") as llm:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def collect_all(client: EngineClient, ids: list[str]) -> dict[str, list]:
    """Every delta of every request, read in an order unrelated to submission."""
    deltas = {}
    for rid in reversed(ids):
        deltas[rid] = list(client.stream(rid))
    return deltas


@pytest.mark.timeout(150)
def test_200_requests_none_lost_none_duplicated(server):
    endpoint, _ = server
    prompts = make_prompts(200, seed=1)
    want = reference(prompts)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with EngineClient(endpoint, timeout_s=60) as client:
        ids = [client.submit(p, params) for p in prompts]
        deltas = collect_all(client, ids)
        stats = client.stats()
    assert len(deltas) == 200
    for rid, expected in zip(ids, want):
        got = deltas[rid]
        assert [d.finished for d in got] == [False] * (len(got) - 1) + [True]
        assert got[-1].finish_reason == "length"
        assert [t for d in got for t in d.token_ids] == expected, rid
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.num_free_blocks == stats.num_blocks


@pytest.mark.timeout(90)
def test_generate_helper_and_text_prompts(server):
    endpoint, endpoint_file = server
    prompts = ["Hello, my name is", {"prompt_token_ids": [1, 2, 3]}, {"prompt": "héllo"}]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(model="tiny", device="cpu") as llm:
        want = llm.generate(prompts, params)
    with EngineClient(endpoint_file, timeout_s=60) as client:  # the endpoint file works too
        got = client.generate(prompts, params)
    for g, w in zip(got, want):
        assert g.prompt_token_ids == w.prompt_token_ids
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].text == w.outputs[0].text
        assert g.outputs[0].finish_reason == "length"


@pytest.mark.timeout(90)
def test_two_clients_at_once_get_only_their_own(server):
    endpoint, _ = server
    prompt_sets = [make_prompts(30, seed=2), make_prompts(30, seed=3)]
    want = [reference(p) for p in prompt_sets]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    results: dict[int, dict] = {}
    errors = []

    def run(k: int) -> None:
        try:
            with EngineClient(endpoint, timeout_s=60) as client:
                # Both clients use the same request ids: they must not mix.
                ids = [client.submit(p, params, request_id=f"r{i}")
                       for i, p in enumerate(prompt_sets[k])]
                results[k] = collect_all(client, ids)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=80)
    assert not errors, errors
    for k in (0, 1):
        got = [[t for d in results[k][f"r{i}"] for t in d.token_ids] for i in range(30)]
        assert got == want[k]


@pytest.mark.timeout(90)
def test_abort_frees_blocks(server):
    endpoint, _ = server
    with EngineClient(endpoint, timeout_s=60) as client:
        rid = client.submit({"prompt_token_ids": list(range(1, 100))},
                            SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True))
        deltas = []
        for delta in client.stream(rid):
            deltas.append(delta)
            if len(deltas) == 3:
                busy = client.stats()
                client.abort(rid)
        assert busy.num_running == 1 and busy.num_free_blocks < busy.num_blocks
        assert deltas[-1].finished and deltas[-1].finish_reason == "abort"
        assert sum(len(d.token_ids) for d in deltas) < 2000
        stats = client.stats()
        assert stats.num_running == 0 and stats.num_waiting == 0
        assert stats.num_free_blocks == stats.num_blocks and stats.kv_usage == 0.0
        client.abort(rid)  # finished already: ignored
        client.abort("never-submitted")
        assert client.generate({"prompt_token_ids": [5, 6]}, {"max_tokens": 2})[0].finished


def raw_exchange(endpoint: str, payloads: list[bytes]) -> list:
    """Send raw frames on a DEALER socket; return the decoded replies."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        for payload in payloads:
            sock.send(payload)
        replies = []
        while len(replies) < len(payloads):
            assert sock.poll(30_000), "the engine did not answer"
            replies.append(decode_server_message(sock.recv()))
        return replies
    finally:
        sock.close()
        ctx.term()


@pytest.mark.timeout(90)
def test_invalid_requests_are_answered_and_the_engine_keeps_serving(server):
    endpoint, _ = server
    bad_type = msgspec.msgpack.encode({"type": "GenerateRequest", "request_id": "t",
                                       "prompt_token_ids": [1, "x"]})
    replies = raw_exchange(endpoint, [
        b"\xc1 not msgpack",
        bad_type,
        encode(GenerateRequest(request_id="both", prompt="a", prompt_token_ids=[1])),
        encode(GenerateRequest(request_id="vocab", prompt_token_ids=[1, 99999])),
        encode(GenerateRequest(request_id="param", prompt="a", sampling_params={"foo": 1})),
        encode(GenerateRequest(request_id="temp", prompt="a",
                               sampling_params={"temperature": -1.0})),
        encode(GenerateRequest(request_id="long", prompt="a",
                               sampling_params={"max_tokens": 10**6})),
    ])
    errors = {r.request_id: r.error for r in replies}
    assert all(isinstance(r, RequestError) for r in replies)
    assert "malformed" in errors[None]
    assert "prompt_token_ids" in errors["t"]
    assert "exactly one of prompt" in errors["both"]
    assert "outside the vocabulary" in errors["vocab"]
    assert "foo" in errors["param"]
    assert "temperature" in errors["temp"]
    assert "max_model_len" in errors["long"]
    with EngineClient(endpoint, timeout_s=60) as client:
        before = client.stats()
    dup = encode(GenerateRequest(request_id="dup", prompt_token_ids=[1, 2],
                                 sampling_params={"max_tokens": 4000, "ignore_eos": True}))
    first, second = raw_exchange(endpoint, [dup, dup])
    assert isinstance(first, RequestAccepted) and first.prompt_token_ids == [1, 2]
    assert isinstance(second, RequestError) and "already in use" in second.error
    with EngineClient(endpoint, timeout_s=60) as client:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            client.generate([{"prompt_token_ids": [3, 4]}, {"prompt_token_ids": [99999]}])
        out = client.generate({"prompt_token_ids": [3, 4]}, {"max_tokens": 3, "ignore_eos": True})
        assert len(out[0].outputs[0].token_ids) == 3
        # The raw socket that sent "dup" is gone: its request was aborted
        # long before its 4000 tokens.
        deadline = time.monotonic() + 60
        while (stats := client.stats()).num_running and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stats.num_running == 0 and stats.num_free_blocks == stats.num_blocks
        assert stats.num_generation_tokens - before.num_generation_tokens < 4000


@pytest.mark.timeout(90)
def test_tcp_port_tp1_stats_log_and_stop_with_live_requests(tmp_path):
    proc, endpoint = start_server(tmp_path, "--nproc-per-node", "1", "serve", "--model", "tiny",
                                  "--device", "cpu", "--port", "0", "--no-async-scheduling",
                                  "--log-stats-interval", "0.2")
    try:
        assert endpoint.startswith("tcp://127.0.0.1:")
        with EngineClient(endpoint, timeout_s=60) as client:
            out = client.generate({"prompt_token_ids": [7, 8, 9]},
                                  SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
            time.sleep(0.5)  # let a stats interval pass
            rid = client.submit({"prompt_token_ids": [1, 2]},
                                {"max_tokens": 4000, "ignore_eos": True})
            stream = client.stream(rid)
            next(stream)
            proc.send_signal(signal.SIGTERM)  # the engine stops with rid running
            with pytest.raises(EngineStoppedError, match="shutting down"):
                list(stream)
            with pytest.raises(EngineStoppedError):
                client.stats()
    finally:
        code, output, leftovers = stop_server(proc)
    assert out[0].outputs[0].token_ids == reference([{"prompt_token_ids": [7, 8, 9]}], 5)[0]
    assert code == 0 and leftovers == []
    assert "Avg generation throughput" in output
