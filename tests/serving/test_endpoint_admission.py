"""Admission at the engine endpoint: text is tokenized off the engine loop.

The endpoint (``serving.endpoint.EngineServer``, its loop in a thread of
the test) serves the tiny model's engine to ``EngineClient``s and to a raw
DEALER socket. One text is held in the engine's tokenizer (a gate on a
``threading.Event``) while other requests are sent: they must complete, with
the tokens of the in-process ``LLM.generate`` (greedy), before the gate
opens; the held request must complete just as right once it opens, or, if
aborted while held, end as "abort" and never reach the engine. The rules of
one client's replies hold: a later message with a waiting request's id is
answered after that request. A held request counts as waiting in the
stats (and the ``/metrics`` gauge) from its arrival, once, and so does its
LoRA adapter. Closing the server leaves no tokenizer thread. A refusal says
whether the request was at fault (``RequestError.invalid_request``): only
then is it the client's error, and only the engine's own failure is logged with its traceback.
"""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from engine import LLM, SamplingParams
from engine.prometheus_metrics import Metrics
from ipc.auth import Authenticator, new_secret
from ipc.engine_messages import (
    GenerateRequest,
    Outputs,
    RequestAccepted,
    RequestError,
    decode_server_message,
)
from ipc.errors import InvalidRequestError
from ipc.serde import encode
from serving.client import EngineClient, EngineStoppedError
from serving.endpoint import Endpoint, EngineServer
from tests.helpers.engine_servers import serving

HELD = "a text the tokenizer holds"
GREEDY = {"temperature": 0.0, "max_tokens": 6, "ignore_eos": True}
OTHERS = ["Hello, my name is", {"prompt_token_ids": [3, 3, 8]}]


class Gate:
    """The tokenizer's ``encode``, held for the text ``HELD`` until the gate
    opens (``entered`` is set once that text is being tokenized); a context
    manager that opens it on exit, so no test leaves it shut."""

    def __init__(self, tokenizer):
        self.encode = tokenizer.encode
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, text: str, *args, **kwargs) -> list[int]:
        if text == HELD:
            self.entered.set()
            self.opened.wait(timeout=60)
        return self.encode(text, *args, **kwargs)

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc) -> None:
        self.opened.set()


def tiny_llm(tiny_dir: str) -> LLM:
    return LLM(model=tiny_dir, device="cpu", executor="uni", max_model_len=256)


@pytest.fixture
def llm(tiny_dir):
    """The engine the endpoint serves."""
    with tiny_llm(tiny_dir) as llm:
        yield llm


@pytest.fixture(scope="module")
def reference_llm(tiny_dir):
    """Another engine of the same model, for the answers to expect."""
    with tiny_llm(tiny_dir) as llm:
        yield llm


    assert [t.name for t in threading.enumerate() if t.name.startswith("tokenize")] == []


def reference(llm: LLM, prompts: list, params: list[dict]) -> list:
    """(prompt ids, output ids, text) of each prompt through ``LLM.generate``."""
    outs = llm.generate(prompts, [SamplingParams(**p) for p in params])
    return [(o.prompt_token_ids, o.outputs[0].token_ids, o.outputs[0].text) for o in outs]


def results(outputs: list) -> list:
    return [(o.prompt_token_ids, o.outputs[0].token_ids, o.outputs[0].text) for o in outputs]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("held", ["prompt", "bad_words"])
def test_a_request_being_tokenized_holds_up_no_other_request(llm, reference_llm, monkeypatch,
                                                              held):
    """The held text is the prompt, or a bad word of a token-id prompt. The
    other client's requests (a text and token ids) and the same client's
    next one complete while it is held."""
    if held == "prompt":
        slow, slow_params = HELD, GREEDY
    else:
        slow, slow_params = {"prompt_token_ids": [5, 9, 2, 7]}, {**GREEDY, "bad_words": [HELD]}
    prompts = [slow, *OTHERS, {"prompt_token_ids": [7, 1]}]
    want = reference(reference_llm, prompts, [slow_params, GREEDY, GREEDY, GREEDY])
    gate = Gate(llm.engine.tokenizer)
    monkeypatch.setattr(llm.engine.tokenizer, "encode", gate)
    with serving(llm) as (server, secret), gate, \
            EngineClient(server.address, secret=secret, timeout_s=30) as first, \
            EngineClient(server.address, secret=secret, timeout_s=30) as second:
        slow_id = first.submit(slow, slow_params)
        assert gate.entered.wait(30)
        assert results(second.generate(OTHERS, GREEDY)) == want[1:3]
        assert results(first.generate(prompts[3], GREEDY)) == want[3:]
        assert not gate.opened.is_set()  # all of it while the text was held
        gate.opened.set()
        entry = first._streams[slow_id]  # its prompt's ids come with the acceptance
        deltas = list(first.stream(slow_id))
    prompt_ids, token_ids, text = want[0]
    assert entry.prompt_token_ids == prompt_ids
    assert [t for d in deltas for t in d.token_ids] == token_ids
    assert "".join(d.text for d in deltas) == text
    assert deltas[-1].finish_reason == "length"


@pytest.mark.timeout(180)
def test_an_abort_while_tokenizing_ends_the_request_and_it_never_runs(llm, reference_llm,
                                                                       monkeypatch):
    want = reference(reference_llm, [HELD], [GREEDY])
    queued = []  # the prompts of the requests the engine queues
    enqueue = llm.engine.enqueue

    def watched_enqueue(request):
        queued.append(request.prompt_token_ids)
        enqueue(request)

    monkeypatch.setattr(llm.engine, "enqueue", watched_enqueue)
    made = threading.Event()  # the held request's making has ended
    new_request = llm.engine.new_request

    def watched_new_request(prompt, *args, **kwargs):
        try:
            return new_request(prompt, *args, **kwargs)
        finally:
            if prompt == HELD:
                made.set()

    monkeypatch.setattr(llm.engine, "new_request", watched_new_request)
    gate = Gate(llm.engine.tokenizer)
    monkeypatch.setattr(llm.engine.tokenizer, "encode", gate)
    with serving(llm) as (server, secret), gate, \
            EngineClient(server.address, secret=secret, timeout_s=30) as client:
        rid = client.submit(HELD, GREEDY)
        assert gate.entered.wait(30)
        client.abort(rid)
        [last] = list(client.stream(rid))
        assert (last.finished, last.finish_reason, last.token_ids) == (True, "abort", [])
        gate.opened.set()
        assert made.wait(30)
        # Loop turns after the making ended: the aborted request is not admitted.
        ids_only = client.generate({"prompt_token_ids": [4, 2]}, GREEDY)
        stats = client.stats()
        # Its id is free again: the same text under it runs as it should.
        again = client.generate(HELD, GREEDY)
    assert results(again) == want
    assert queued == [[4, 2], want[0][0]]  # never the aborted one
    assert len(ids_only[0].outputs[0].token_ids) == GREEDY["max_tokens"]
    assert stats.num_running == stats.num_waiting == 0


def _raw_client(address: str, secret: bytes):
    """A DEALER socket and the sealing of the server's secret."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return ctx, sock, Authenticator.for_client(secret)


@pytest.mark.timeout(180)
def test_a_message_with_the_id_of_a_waiting_request_is_answered_after_it(llm, reference_llm,
                                                                         monkeypatch):
    """A text request "x" is held; then come a token-id request "y" and a
    second "x". "y" is answered and runs to its end while "x" waits (a
    waiting request holds back none of the client's others); the second
    "x" is refused, but only after the first "x" is accepted."""
    want = reference(reference_llm, [HELD, {"prompt_token_ids": [6, 6, 6]}], [GREEDY, GREEDY])
    gate = Gate(llm.engine.tokenizer)
    monkeypatch.setattr(llm.engine.tokenizer, "encode", gate)
    with serving(llm) as (server, secret), gate:
        ctx, sock, auth = _raw_client(server.address, secret)
        try:
            for request_id, prompt in [("x", {"prompt": HELD}),
                                       ("y", {"prompt_token_ids": [6, 6, 6]}),
                                       ("x", {"prompt_token_ids": [1]})]:
                sock.send_multipart(auth.seal(encode(GenerateRequest(
                    request_id=request_id, sampling_params=GREEDY, **prompt))))
            replies = {"x": [], "y": []}

            def receive():
                assert sock.poll(30_000), "the engine did not answer"
                message = decode_server_message(auth.unseal(sock.recv_multipart()))
                if isinstance(message, Outputs):
                    for delta in message.deltas:
                        replies[delta.request_id].append(delta)
                else:
                    replies[message.request_id].append(message)

            while not (replies["y"] and getattr(replies["y"][-1], "finished", False)):
                receive()
            assert gate.entered.is_set() and not gate.opened.is_set()
            assert replies["x"] == []
            gate.opened.set()
            while not (replies["x"] and getattr(replies["x"][-1], "finished", False)):
                receive()
        finally:
            sock.close()
            ctx.term()
    for request_id, (prompt_ids, token_ids, _) in zip("xy", want):
        accepted, *rest = replies[request_id]
        assert isinstance(accepted, RequestAccepted) and accepted.prompt_token_ids == prompt_ids
        if request_id == "x":
            refused, *rest = rest
            assert isinstance(refused, RequestError) and "already in use" in refused.error
        assert [t for d in rest for t in d.token_ids] == token_ids


@pytest.mark.timeout(180)
def test_a_stop_tells_the_client_of_a_request_being_tokenized(llm, monkeypatch):
    gate = Gate(llm.engine.tokenizer)
    monkeypatch.setattr(llm.engine.tokenizer, "encode", gate)
    with serving(llm) as (server, secret), gate, \
            EngineClient(server.address, secret=secret, timeout_s=30) as client:
        rid = client.submit(HELD, GREEDY)
        assert gate.entered.wait(30)
        server.stop()
        with pytest.raises(EngineStoppedError, match="shutting down"):
            list(client.stream(rid))


def _stats_around_the_held_text(client: EngineClient, gate: Gate, rid: str):
    """(``client``'s stats while request ``rid``'s text is held in the
    tokenizer, the request's deltas once ``gate`` opens, the stats after
    its end). The text must reach the tokenizer within 30 s."""
    assert gate.entered.wait(30)
    held = client.stats()
    gate.opened.set()
    deltas = list(client.stream(rid))
    return held, deltas, client.stats()


def _waiting_gauge(stats) -> float:
    """``tprun:num_requests_waiting`` on the ``/metrics`` page of ``stats``."""
    page = Metrics("tiny").render(stats).decode()
    [value] = [s.value for family in text_string_to_metric_families(page)
               for s in family.samples if s.name == "tprun:num_requests_waiting"]
    return value


def _stats_line_counts(caplog) -> list[tuple[int, int]]:
    """(Waiting, Running) of each stats line logged so far."""
    return [(int(m[2]), int(m[1])) for r in caplog.records if r.name == "tprun.stats"
            if (m := re.search(r"Running: (\d+) reqs, Waiting: (\d+) reqs", r.getMessage()))]


@pytest.mark.timeout(180)
def test_a_request_being_tokenized_counts_as_waiting_once(tiny_dir, reference_llm, monkeypatch,
                                                          caplog):
    """From its arrival, as vLLM counts: while its text is held in the
    tokenizer the request waits in the client's stats, on the ``/metrics``
    page made from them and in the engine's stats line (logged at every
    turn of the loop here); queued in the engine, it is counted once (no
    line counts two requests), and at its end no more."""
    want = reference(reference_llm, [HELD], [GREEDY])
    with LLM(model=tiny_dir, device="cpu", executor="uni", max_model_len=256,
             disable_log_stats=False, log_stats_interval_s=1e-6) as llm:
        gate = Gate(llm.engine.tokenizer)
        monkeypatch.setattr(llm.engine.tokenizer, "encode", gate)
        with caplog.at_level(logging.INFO, logger="tprun.stats"), \
                serving(llm) as (server, secret), gate, \
                EngineClient(server.address, secret=secret, timeout_s=30) as client:
            before = client.stats()
            rid = client.submit(HELD, GREEDY)
            assert gate.entered.wait(30)
            held = client.stats()
            while (1, 0) not in _stats_line_counts(caplog):  # none: the test's timeout
                time.sleep(0.01)
            gate.opened.set()
            deltas = list(client.stream(rid))
            after = client.stats()
    assert (before.num_waiting, before.num_running) == (0, 0)
    assert (held.num_waiting, held.num_running) == (1, 0)
    assert _waiting_gauge(held) == 1.0 and _waiting_gauge(after) == 0.0
    lines = _stats_line_counts(caplog)
    assert (0, 1) in lines and all(waiting + running <= 1 for waiting, running in lines)
    assert (after.num_waiting, after.num_running) == (0, 0)
    assert [t for d in deltas for t in d.token_ids] == want[0][1]


@pytest.mark.timeout(180)
def test_a_request_being_tokenized_names_its_adapter_as_waiting(tmp_path, monkeypatch):
    """vLLM's ``waiting_lora_adapters`` counts a request from its arrival,
    as ``num_waiting`` does: while its text (a bad word) is held in the
    tokenizer, the adapter it runs with is listed as waiting once (and, on the
    ``/metrics`` page, in ``lora_requests_info``'s label); at its end, no
    adapter is listed."""
    from tests.helpers.lora_adapters import model_with_adapter_requests

    model_dir, loras, _ = model_with_adapter_requests(tmp_path, [[5, 17, 99, 3]], 1)
    with LLM(model=model_dir, device="cpu", executor="uni", max_model_len=256,
             enable_lora=True, max_loras=1) as llm:
        gate = Gate(llm.engine.tokenizer)
        monkeypatch.setattr(llm.engine.tokenizer, "encode", gate)
        with serving(llm) as (server, secret), gate, \
                EngineClient(server.address, secret=secret, timeout_s=30) as client:
            rid = client.submit({"prompt_token_ids": [5, 17, 99, 3]},
                                {**GREEDY, "bad_words": [HELD]}, lora_request=loras[1])
            held, deltas, after = _stats_around_the_held_text(client, gate, rid)
    assert (held.num_waiting, held.num_running) == (1, 0)
    assert held.waiting_lora_adapters == {"adapter1": 1}
    assert held.running_lora_adapters == {}
    page = Metrics("tiny", max_loras=1).render(held).decode()
    [labels] = [s.labels for family in text_string_to_metric_families(page)
                for s in family.samples if s.name == "tprun:lora_requests_info"]
    assert labels == {"max_lora": "1", "waiting_lora_adapters": "adapter1",
                      "running_lora_adapters": ""}
    assert len([t for d in deltas for t in d.token_ids]) == GREEDY["max_tokens"]
    assert (after.waiting_lora_adapters, after.running_lora_adapters) == ({}, {})


@pytest.mark.timeout(180)
def test_a_server_counts_its_own_waiting_requests(llm, monkeypatch):
    """The waiting requests are the server's: another server made over the
    same engine (and closed, never serving) changes nothing in what the
    first one counts."""
    gate = Gate(llm.engine.tokenizer)
    monkeypatch.setattr(llm.engine.tokenizer, "encode", gate)
    with serving(llm) as (server, secret), gate, \
            EngineClient(server.address, secret=secret, timeout_s=30) as client:
        EngineServer(llm.engine, Endpoint.create(), secret=new_secret()).close()
        rid = client.submit(HELD, GREEDY)
        held, deltas, after = _stats_around_the_held_text(client, gate, rid)
    assert (held.num_waiting, held.num_running) == (1, 0)
    assert (after.num_waiting, after.num_running) == (0, 0)
    assert len([t for d in deltas for t in d.token_ids]) == GREEDY["max_tokens"]


@pytest.mark.timeout(180)
def test_a_refusal_says_whether_the_request_was_at_fault(llm, reference_llm, monkeypatch,
                                                          caplog):
    """Refused for what it asks (a temperature out of range, ids outside the
    vocabulary): ``invalid_request``, logged nowhere, and ``EngineClient``
    raises ``InvalidRequestError``. Refused for a message the protocol does
    not allow (``n`` 2): not the request's fault, one warning line. The
    engine's own failure to make a request (a plain ``ValueError`` of a
    bug): not the request's fault, logged with its traceback, and
    ``EngineClient`` raises a plain ``ValueError``. The engine goes on."""
    new_request = llm.engine.new_request

    def buggy_new_request(prompt, *args, **kwargs):
        if prompt == {"prompt_token_ids": [9, 9]}:
            raise ValueError("an internal bug")
        return new_request(prompt, *args, **kwargs)

    monkeypatch.setattr(llm.engine, "new_request", buggy_new_request)
    sent = {"bad": {"temperature": -1.0}, "protocol": {"n": 2}, "bug": GREEDY}
    with caplog.at_level(logging.INFO, logger="serving.endpoint"), serving(llm) as (
            server, secret):
        ctx, sock, auth = _raw_client(server.address, secret)
        try:
            for request_id, params in sent.items():
                ids = [9, 9] if request_id == "bug" else [1, 2]
                sock.send_multipart(auth.seal(encode(GenerateRequest(
                    request_id=request_id, prompt_token_ids=ids, sampling_params=params))))
            refusals = {}
            while len(refusals) < len(sent):
                assert sock.poll(30_000), "the engine did not answer"
                reply = decode_server_message(auth.unseal(sock.recv_multipart()))
                refusals[reply.request_id] = reply
        finally:
            sock.close()
            ctx.term()
        with EngineClient(server.address, secret=secret, timeout_s=30) as client:
            with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
                client.generate({"prompt_token_ids": [99999]}, GREEDY)
            with pytest.raises(ValueError, match="an internal bug") as raised:
                client.generate({"prompt_token_ids": [9, 9]}, GREEDY)
            assert not isinstance(raised.value, InvalidRequestError)
            after = client.generate({"prompt_token_ids": [3, 3, 8]}, GREEDY)
    assert all(isinstance(r, RequestError) for r in refusals.values()), refusals
    assert {k: r.invalid_request for k, r in refusals.items()} == \
        {"bad": True, "protocol": False, "bug": False}
    assert "temperature must be >= 0" in refusals["bad"].error
    assert "n 1 and no stop strings" in refusals["protocol"].error
    assert refusals["bug"].error == "an internal bug"
    logged = {r.getMessage(): r.exc_info for r in caplog.records}
    assert not any("'bad'" in message for message in logged)
    assert logged["request 'protocol' refused: an engine request takes n 1 and no stop "
                  "strings: the caller runs n requests and cuts their text (as LLM and the "
                  "HTTP server do)"] is None
    assert logged["request 'bug' refused: the engine failed to make it"][1].args == \
        ("an internal bug",)
    assert results(after) == reference(reference_llm, [{"prompt_token_ids": [3, 3, 8]}],
                                       [GREEDY])
