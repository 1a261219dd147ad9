"""Fuzz the fields of well-formed, signed requests on the engine endpoint.

``test_engine_fuzz.py`` sends messages that are no request (unsigned,
garbage, the wrong type, frames over the size bound). Here every message is
a validly signed ``GenerateRequest`` whose fields are hostile:
``sampling_params`` with keys of ``SamplingParams`` (and unknown ones) set
to any msgpack value (nested maps and arrays, bytes, ints across the 64-bit
ranges, NaN and infinities, strings), prompts of random text or of token
ids up to 2**64 - 1, both or neither, priorities across the int64 range.

Each request gets exactly one outcome: a ``RequestError``, or its
``RequestAccepted`` and then deltas up to its last. No refusal is a
failure of the server's own (an exception of another type than
``ValueError``/``TypeError`` is logged with its traceback: none may be).
Afterwards nothing runs, every KV block is free, no message was counted as
unauthenticated, and a real client gets the tokens it got before. Fields of
megabytes (far below the socket's bound) are answered like any others.
The server runs with ``--max-model-len 64``, so a request that happens to be
valid generates a few tokens at most.
"""

from __future__ import annotations

import itertools

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.sampling_params import SamplingParams
from ipc.auth import Authenticator, read_key_file
from ipc.engine_messages import (
    EngineStats,
    Outputs,
    RequestAccepted,
    RequestError,
    StatsRequest,
    decode_server_message,
)
from ipc.serde import encode
from serving.client import EngineClient
from tests.helpers.serve_utils import start_server, stop_server

INT64 = (-(1 << 63), (1 << 63) - 1)
PROMPTS = [{"prompt_token_ids": [3, 17, 250, 9]}, "fuzz"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = start_server(tmp_path_factory.mktemp("fuzz-fields"), "--nproc-per-node", "1",
                          "serve", "--model", "tiny", "--device", "cpu", "--max-model-len", "64",
                          "--disable-log-stats")
    yield served
    code, output, leftovers = stop_server(served)
    assert code == 0, output[-3000:]
    assert leftovers == []


class Peer:
    """A raw DEALER socket with the server's key; ``outcome`` sends one
    request and reads its replies up to its end."""

    def __init__(self, served):
        self.auth = Authenticator.for_client(read_key_file(served.key_file))
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(served.endpoint)
        self.ids = itertools.count()

    def receive(self):
        assert self.socket.poll(30_000), "the engine did not answer within 30 s"
        return decode_server_message(self.auth.unseal(self.socket.recv_multipart()))

    def outcome(self, fields: dict) -> list:
        """Send a GenerateRequest of ``fields`` (a fresh id unless given);
        its replies: [RequestError] or [RequestAccepted, Delta..., last Delta]."""
        request_id = fields.setdefault("request_id", f"q{next(self.ids)}")
        self.socket.send_multipart(self.auth.seal(msgspec.msgpack.encode(
            {"type": "GenerateRequest", **fields})))
        replies = []
        while True:
            message = self.receive()
            items = message.deltas if isinstance(message, Outputs) else [message]
            for item in items:
                assert item.request_id == request_id, item  # nothing of another request
                replies.append(item)
                if isinstance(item, RequestError) or getattr(item, "finished", False):
                    return replies

    def stats(self) -> EngineStats:
        self.socket.send_multipart(self.auth.seal(encode(StatsRequest())))
        reply = self.receive()
        assert isinstance(reply, EngineStats), reply
        return reply

    def close(self) -> None:
        self.socket.close()
        self.ctx.term()


@pytest.fixture(scope="module")
def peer(served):
    peer = Peer(served)
    yield peer
    peer.close()


@pytest.fixture(scope="module")
def reference(served) -> list[list[int]]:
    """The greedy tokens a real client gets before any fuzzing."""
    return _greedy(served)


def _greedy(served) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    with EngineClient(served.endpoint_file, timeout_s=60) as client:
        return [o.outputs[0].token_ids for o in client.generate(PROMPTS, params)]


def _one_outcome(replies: list) -> None:
    if isinstance(replies[0], RequestError):
        assert len(replies) == 1 and replies[0].error, replies
        return
    assert isinstance(replies[0], RequestAccepted), replies
    assert [d.finished for d in replies[1:]] == [False] * (len(replies) - 2) + [True], replies


def _engine_is_idle_and_served_on(served, peer: Peer, before: EngineStats,
                                  reference: list[list[int]]) -> None:
    after = peer.stats()
    assert after.num_running == after.num_waiting == 0
    assert after.num_free_blocks == after.num_blocks
    assert after.num_refused_messages == before.num_refused_messages  # all were signed
    assert _greedy(served) == reference
    assert "Traceback" not in served.output()


MSGPACK_LEAVES = (st.none() | st.booleans() | st.integers(INT64[0], (1 << 64) - 1)
                  | st.integers(-3, 70) | st.floats() | st.text(max_size=8)
                  | st.binary(max_size=8))
MSGPACK_VALUES = st.recursive(
    MSGPACK_LEAVES,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=4) | st.integers(-3, 400), inner, max_size=3),
    max_leaves=8)
SAMPLING_KEYS = st.sampled_from([*SamplingParams.__struct_fields__, "unknown"])


@st.composite
def hostile_requests(draw) -> dict:
    """A GenerateRequest's fields: every other time 1 to 3 sampling
    parameters set to random values (max_tokens 2 unless drawn), a prompt of
    text or of ids (now and then both or neither), and a priority (mostly 0,
    which "fcfs" takes): weights that let about one request in eight be
    valid, so both outcomes are reached."""
    drawn = draw(st.just({}) | st.dictionaries(SAMPLING_KEYS, MSGPACK_VALUES, min_size=1,
                                               max_size=3))
    fields = {"sampling_params": {"max_tokens": 2, **drawn},
              "priority": draw(st.one_of(st.just(0), st.just(0), st.just(0),
                                         st.integers(*INT64)))}
    ids = st.lists(st.integers(0, 319) | st.integers(0, (1 << 64) - 1), min_size=1,
                   max_size=6)
    given = draw(st.sampled_from([("prompt",), ("prompt_token_ids",), ("prompt",),
                                  ("prompt_token_ids",), (), ("prompt", "prompt_token_ids")]))
    if "prompt" in given:
        fields["prompt"] = draw(st.text(min_size=1, max_size=12))
    if "prompt_token_ids" in given:
        fields["prompt_token_ids"] = draw(ids)
    return fields


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_hostile_fields_get_one_outcome_each_and_the_engine_serves_on(served, peer, reference):
    before = peer.stats()
    outcomes = []

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(hostile_requests())
    def check(fields):
        replies = peer.outcome(fields)
        _one_outcome(replies)
        outcomes.append(type(replies[0]))

    check()
    assert RequestError in outcomes and RequestAccepted in outcomes  # both sides reached
    _engine_is_idle_and_served_on(served, peer, before, reference)


@pytest.mark.timeout(120)
def test_fields_of_megabytes_are_answered_like_any(served, peer, reference):
    before = peer.stats()
    long_id = "i" * (4 << 20)
    replies = peer.outcome({"request_id": long_id, "prompt": "hi",
                            "sampling_params": {"max_tokens": 2}})
    _one_outcome(replies)
    assert isinstance(replies[0], RequestAccepted)
    too_long = peer.outcome({"prompt": "t" * (1 << 20), "sampling_params": {"max_tokens": 2}})
    assert isinstance(too_long[0], RequestError) and "max_model_len" in too_long[0].error
    many_ids = peer.outcome({"prompt_token_ids": [7] * (1 << 20)})
    assert isinstance(many_ids[0], RequestError) and "max_model_len" in many_ids[0].error
    huge_params = peer.outcome({"prompt": "hi", "sampling_params": {
        "max_tokens": 2, "stop_token_ids": list(range(1 << 18)),
        "logit_bias": {i: 1.0 for i in range(1 << 16)}, "bad_words": ["x" * 1000] * 1000}})
    assert isinstance(huge_params[0], RequestError), huge_params
    _engine_is_idle_and_served_on(served, peer, before, reference)
