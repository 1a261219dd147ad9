"""The engine over IPC: ``tprun serve`` (TP=2, a subprocess) and ``EngineClient``.

Every answer is checked against an independent reference: the same prompts
through the in-process ``LLM`` (greedy). The server is started once for
the module in its own session; its shutdown (SIGTERM: exit code 0, no
process, socket, endpoint file or key file left) is checked when the module
ends. Every message is sealed with the launch's key (``ipc.auth``); the
tests that speak raw ZeroMQ read it from the key file.
"""

from __future__ import annotations

import os
import random
import signal
import stat
import threading
import time

import msgspec
import pytest
import zmq

from engine import LLM, RequestOutputKind, SamplingParams
from ipc.auth import Authenticator, read_key_file
from ipc.engine_messages import (
    GenerateRequest,
    RequestAccepted,
    RequestError,
    decode_server_message,
)
from ipc.errors import InvalidRequestError
from ipc.serde import encode
from serving import protocol_core
from serving.client import EngineClient, EngineStoppedError
from tests.helpers.request_metrics import Window, assert_in_order
from tests.helpers.serve_utils import start_server, stop_server

pytestmark = pytest.mark.slow  # every test starts a server with worker daemons

MAX_TOKENS = 4


def assert_cleaned_up(served, endpoint: str) -> None:
    """No endpoint file, key file, or private directory left."""
    assert not os.path.exists(served.endpoint_file)
    assert not os.path.exists(served.key_file)
    if endpoint.startswith("ipc://"):
        assert not os.path.exists(os.path.dirname(endpoint[len("ipc://"):]))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("serve")
    served = start_server(tmp_path, "--nproc-per-node", "2", "serve", "--model",
                          "tiny", "--device", "cpu", "--disable-log-stats")
    endpoint = served.endpoint
    yield endpoint, served.endpoint_file
    code, out, leftovers = stop_server(served)
    assert code == 0, out
    assert f"engine endpoint {endpoint} (key file {served.key_file})" in out
    assert leftovers == []
    assert_cleaned_up(served, endpoint)


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
        assert g.outputs[0].finish_reason == "length" and g.outputs[0].stop_reason is None


@pytest.mark.timeout(90)
def test_generate_helper_returns_final_outputs_whatever_the_output_kind(server):
    """``output_kind`` is for streaming callers (``AsyncLLM``): it crosses
    the endpoint, and ``generate`` still returns each output whole."""
    endpoint, _ = server
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(model="tiny", device="cpu") as llm:
        want = llm.generate("Hello", params)[0].outputs[0]
    with EngineClient(endpoint, timeout_s=60) as client:
        for kind in RequestOutputKind:
            got = client.generate("Hello", params.replaced(output_kind=kind))[0]
            assert got.finished
            assert (got.outputs[0].text, got.outputs[0].token_ids) == (want.text, want.token_ids)


@pytest.mark.timeout(120)
def test_generate_helper_takes_n_and_stop_strings_as_llm_does(server):
    """``n`` seeded choices and a stop string met by one of them: the same
    completions, text, reasons and logprobs' sum as ``LLM.generate``."""
    _, endpoint_file = server
    prompt = "Hello, my name is"
    plain = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=12, ignore_eos=True)
    with LLM(model="tiny", device="cpu") as llm:
        first = llm.generate(prompt, plain)[0].outputs[0].text
        stop = first[3:5]
        params = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=12, ignore_eos=True,
                                stop=[stop], logprobs=1)
        [want] = llm.generate(prompt, params)
    with EngineClient(endpoint_file, timeout_s=60) as client:
        [got] = client.generate(prompt, params)
    assert [c.index for c in got.outputs] == [0, 1, 2]
    assert want.outputs[0].stop_reason == stop  # the case has a stop string met
    for g, w in zip(got.outputs, want.outputs):
        assert (g.token_ids, g.text) == (w.token_ids, w.text)
        assert (g.finish_reason, g.stop_reason) == (w.finish_reason, w.stop_reason)
        assert g.cumulative_logprob == pytest.approx(w.cumulative_logprob, abs=1e-4)


@pytest.mark.timeout(120)
def test_generate_helper_ends_at_the_first_stop_string_completed(server):
    """Stops ["y", "xyz"] where the greedy text (lowercase letters, one token
    each) first has "y" at j, after "x" and before "z": "y" ends the output
    at token j, though "xyz" began earlier and comes true a token later
    (vLLM's rule); the output keeps the tokens up to j and their logprobs
    only (hand-worked from the greedy ids)."""
    _, endpoint_file = server
    letters = list(range(ord("a"), ord("z") + 1))
    greedy = {"temperature": 0.0, "max_tokens": 16, "ignore_eos": True,
              "allowed_token_ids": letters}
    with EngineClient(endpoint_file, timeout_s=60) as client:
        ids = client.generate("Hello, my name is", SamplingParams(**greedy))[0].outputs[0].token_ids
        text = "".join(map(chr, ids))
        j = next(i for i in range(1, len(text) - 1) if text[i] not in text[:i])
        [out] = client.generate("Hello, my name is", SamplingParams(
            **greedy, stop=[text[j], text[j - 1:j + 2]], logprobs=1))
    c = out.outputs[0]
    assert (c.finish_reason, c.stop_reason) == ("stop", text[j])
    assert (c.token_ids, c.text) == (ids[:j + 1], text[:j])
    assert len(c.logprobs) == j + 1


@pytest.mark.timeout(120)
def test_generate_helper_gives_each_output_its_metrics(server):
    """``RequestOutput.metrics`` over the endpoint: the client's arrival and
    token times in order within the call (the engine's queueing and
    scheduling unknown here), every choice's tokens counted (n=2), and of
    a choice cut at a stop string only those it kept."""
    _, endpoint_file = server
    prompt = "Hello, my name is"
    with EngineClient(endpoint_file, timeout_s=60) as client:
        [plain] = client.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8,
                                                         ignore_eos=True))
        params = [SamplingParams(n=2, temperature=1.0, seed=4, max_tokens=5, ignore_eos=True),
                  SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                 stop=[plain.outputs[0].text[3:5]])]
        with Window() as window:
            outs = client.generate([prompt, prompt], params)
    stopped = outs[1].outputs[0]
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) < 8
    assert [o.metrics.num_generation_tokens for o in outs] == [10, len(stopped.token_ids)]
    for out in outs:
        assert_in_order(out, window, engine_side=False)


@pytest.mark.timeout(90)
def test_a_stop_token_crosses_the_endpoint_as_its_id_without_its_text(server):
    """The stop token is the output's last id and its ``stop_reason``; its
    text is not in the output (the tokenizer's decode of the ids before it)."""
    _, endpoint_file = server
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with LLM(model="tiny", device="cpu") as llm:
        ids = llm.generate("Hello, my name is", greedy)[0].outputs[0].token_ids
        tokenizer = llm.get_tokenizer()
    at = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                            stop_token_ids=[ids[at]])
    with EngineClient(endpoint_file, timeout_s=60) as client:
        out = client.generate(["Hello, my name is"], params)[0].outputs[0]
    assert out.token_ids == ids[:at + 1] and out.finish_reason == "stop"
    assert out.stop_reason == ids[at] and out.text == tokenizer.decode(ids[:at])


@pytest.mark.timeout(90)
def test_logprobs_cross_the_endpoint(server):
    endpoint, _ = server
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3)
    with LLM(model="tiny", device="cpu") as llm:
        want = llm.generate(["Hello, my name is"], params)[0].outputs[0]
    with EngineClient(endpoint, timeout_s=60) as client:
        got = client.generate(["Hello, my name is"], params)[0].outputs[0]
    assert got.token_ids == want.token_ids and len(got.logprobs) == 5
    for g, w in zip(got.logprobs, want.logprobs):
        assert list(g) == list(w)  # same candidates, in the same order
        for token_id, lp in w.items():
            assert g[token_id].rank == lp.rank
            assert g[token_id].logprob == pytest.approx(lp.logprob, abs=1e-4)  # TP=2 vs TP=1


@pytest.mark.timeout(90)
def test_detokenize_false_crosses_the_endpoint_as_ids_only(server):
    """vLLM's ``detokenize=False``: the endpoint runs no detokenizer for the
    request, so its output has the reference's ids and an empty text."""
    endpoint, _ = server
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(model="tiny", device="cpu") as llm:
        want = llm.generate(["Hello, my name is"], params)[0].outputs[0]
    with EngineClient(endpoint, timeout_s=60) as client:
        got = client.generate(["Hello, my name is"], params.replaced(detokenize=False))
        shown = client.generate(["Hello, my name is"], params)
    assert (got[0].outputs[0].token_ids, got[0].outputs[0].text) == (want.token_ids, "")
    assert shown[0].outputs[0].text == want.text != ""


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
    """Send payloads, sealed with the server's key (found next to the ipc
    socket), on a raw DEALER socket; return the decoded replies."""
    auth = Authenticator.for_client(read_key_file(endpoint[len("ipc://"):] + ".key"))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        for payload in payloads:
            sock.send_multipart(auth.seal(payload))
        replies = []
        while len(replies) < len(payloads):
            assert sock.poll(30_000), "the engine did not answer"
            replies.append(decode_server_message(auth.unseal(sock.recv_multipart())))
        return replies
    finally:
        sock.close()
        ctx.term()


def _nested_objects(levels: int) -> dict:
    """A JSON schema of ``levels`` objects nested in one another."""
    schema: dict = {"type": "integer"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


def _deeply_nested_request() -> bytes:
    """A ``GenerateRequest`` whose ``sampling_params`` nest 5000 maps deep,
    past what the decoder can follow (written by hand: no encoder goes
    there either)."""
    pack = msgspec.msgpack.encode
    head = b"".join(pack(v) for v in ("type", "GenerateRequest", "request_id", "deep bytes",
                                      "prompt", "a", "sampling_params"))
    return b"\x84" + head + b"\x81\xa1a" * 5000 + b"\x80"  # {"a": {"a": ... {}}}


@pytest.mark.timeout(90)
def test_invalid_requests_are_answered_and_the_engine_keeps_serving(server, monkeypatch):
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
        encode(GenerateRequest(request_id="n", prompt="a", sampling_params={"n": 2})),
        encode(GenerateRequest(request_id="stop", prompt="a", sampling_params={"stop": "."})),
        encode(GenerateRequest(request_id="deep schema", prompt="a", sampling_params={
            "structured_outputs": {"json": _nested_objects(300)}})),
        _deeply_nested_request(),
    ])
    errors = {r.request_id: r.error for r in replies}
    assert all(isinstance(r, RequestError) for r in replies)
    assert "malformed" in errors[None]
    assert "nests objects and arrays more than 124 levels deep" in errors["deep schema"]
    unnamed = [r.error for r in replies if r.request_id is None]  # too malformed to name
    assert len(unnamed) == 2  # the bytes that are not msgpack, and those nested too deep
    assert "malformed request: values nested too deep to decode" in unnamed
    assert "prompt_token_ids" in errors["t"]
    assert "exactly one of prompt" in errors["both"]
    assert "outside the vocabulary" in errors["vocab"]
    assert "foo" in errors["param"]
    assert "temperature" in errors["temp"]
    assert "max_model_len" in errors["long"]
    long = next(r for r in replies if r.request_id == "long")  # the field blamed crosses too
    assert (long.invalid_request, long.code, long.param) == (
        True, "context_length_exceeded", "max_tokens")
    assert "n 1 and no stop strings" in errors["n"] and "n 1 and no stop" in errors["stop"]
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
        with pytest.raises(InvalidRequestError, match="max_model_len") as refused:
            client.generate({"prompt_token_ids": [3, 4]}, {"max_tokens": 10**6})
        assert (refused.value.code, refused.value.param) == ("context_length_exceeded",
                                                             "max_tokens")
        with pytest.raises(ValueError, match="request_id must be a string"):
            client.submit("a", request_id=5)
        # A prompt or priority of a wrong type is the caller's error, as LLM's.
        with pytest.raises(InvalidRequestError, match="prompt_token_ids must be ints"):
            client.submit({"prompt_token_ids": [1, "x"]})
        with pytest.raises(InvalidRequestError, match="priority must be an int"):
            client.submit("a", priority="high")
        # The bound is the engine socket's own (one constant); a small one
        # here keeps the test's message small.
        monkeypatch.setattr(protocol_core, "MAX_MESSAGE_BYTES", 1 << 20)
        with pytest.raises(ValueError, match="the engine takes at most 1048576"):
            client.submit({"prompt_token_ids": [300] * (400 << 10)})  # 3 bytes each: 1.2 MB
        monkeypatch.undo()
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
def test_tcp_port_tp1_stats_log_and_stop_with_live_requests(tmp_path, caplog):
    """A shutdown with a request running ends it with the reason; the client
    logs that as a warning (the engine was told to stop), not an error."""
    served = start_server(tmp_path, "--nproc-per-node", "1", "serve", "--model", "tiny",
                          "--device", "cpu", "--port", "0", "--no-async-scheduling",
                          "--log-stats-interval", "0.2")
    endpoint = served.endpoint
    try:
        assert endpoint.startswith("tcp://127.0.0.1:")  # loopback unless --host says otherwise
        assert stat.S_IMODE(os.stat(served.key_file).st_mode) == 0o600
        with pytest.raises(ValueError, match="no key for tcp://"):
            EngineClient(endpoint)  # a tcp:// address names no key file
        with EngineClient(endpoint, timeout_s=60, key_file=served.key_file) as client:
            out = client.generate({"prompt_token_ids": [7, 8, 9]},
                                  SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
            time.sleep(0.5)  # let a stats interval pass
            rid = client.submit({"prompt_token_ids": [1, 2]},
                                {"max_tokens": 4000, "ignore_eos": True})
            stream = client.stream(rid)
            next(stream)
            served.proc.send_signal(signal.SIGTERM)  # the engine stops with rid running
            with pytest.raises(EngineStoppedError, match="shutting down"):
                list(stream)
            with pytest.raises(EngineStoppedError):
                client.stats()
    finally:
        code, output, leftovers = stop_server(served)
    logged = [r for r in caplog.records if r.name == "serving.protocol_core"]
    assert [(r.levelname, r.getMessage()) for r in logged] == [
        ("WARNING", "engine stopped with 1 request(s) unfinished: the engine is shutting down")]
    assert out[0].outputs[0].token_ids == reference([{"prompt_token_ids": [7, 8, 9]}], 5)[0]
    assert code == 0 and leftovers == []
    assert "Avg generation throughput" in output
    assert "warning" not in output.lower()
    assert_cleaned_up(served, endpoint)


@pytest.mark.timeout(120)
def test_priority_crosses_the_endpoint(tmp_path, server):
    """Behind a long request holding the one sequence, two prompts sharing
    48 tokens wait; the lower priority value runs first and the other finds
    the shared tokens in the prefix cache. A server under "fcfs" refuses a
    priority, naming the policy."""
    endpoint, endpoint_file = server
    shared = list(range(10, 58))
    prompts = [{"prompt_token_ids": shared + [1, 2]}, {"prompt_token_ids": shared + [3, 4]}]
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    with EngineClient(endpoint_file, timeout_s=60) as client:
        with pytest.raises(ValueError, match="priority 1 needs the 'priority' scheduling"):
            client.generate(prompts, params, priority=[0, 1])
    served = start_server(tmp_path, "--nproc-per-node", "1", "serve", "--model", "tiny",
                          "--device", "cpu", "--disable-log-stats", "--max-num-seqs", "1",
                          "--scheduling-policy", "priority")
    try:
        with EngineClient(served.endpoint_file, timeout_s=60) as client:
            blocker = client.submit({"prompt_token_ids": [5, 6]},
                                    {"max_tokens": 1000, "ignore_eos": True}, priority=-5)
            stream = client.stream(blocker)
            next(stream)  # it runs: the two below queue behind it
            outs = client.generate(prompts, params, priority=[7, 3])
            assert len(list(stream)) > 0
    finally:
        code, output, leftovers = stop_server(served)
    assert [o.num_cached_tokens for o in outs] == [48, 0]  # the second prompt ran first
    assert [o.outputs[0].token_ids for o in outs] == reference(prompts, 2)
    assert code == 0 and leftovers == [], output


@pytest.mark.timeout(90)
def test_sigint_stops_like_sigterm(tmp_path):
    served = start_server(tmp_path, "--nproc-per-node", "2", "serve", "--model", "tiny",
                          "--device", "cpu", "--disable-log-stats")
    endpoint = served.endpoint
    try:
        assert len(served.pids()) == 3  # the server and two workers
        with EngineClient(endpoint, timeout_s=60) as client:
            rid = client.submit({"prompt_token_ids": [1, 2]},
                                {"max_tokens": 4000, "ignore_eos": True})
            stream = client.stream(rid)
            next(stream)
            served.proc.send_signal(signal.SIGINT)
            with pytest.raises(EngineStoppedError, match="shutting down"):
                list(stream)
    finally:
        code, output, leftovers = stop_server(served, signal.SIGINT)
    assert code == 0, output
    assert leftovers == []
    assert "Traceback" not in output
    assert_cleaned_up(served, endpoint)
