"""Fuzz the engine endpoint: garbage in, no harm done, real clients still served.

One ``tprun serve`` (TP=1, tiny, CPU) serves the whole module. Each
example sends one bad message on a raw DEALER socket, then a signed
``StatsRequest`` on the same socket: ZeroMQ keeps one connection's
messages in order, so the stats answer proves the bad message was handled,
and tells how. A message without a valid MAC (random bytes, truncated,
wrong-type, wrong MAC, wrong frame count, another key, a reflected reply)
must get no answer at all, add exactly one to ``num_refused_messages``, and
schedule nothing. A validly signed message that does not decode gets
exactly one ``RequestError``. A frame above MAXMSGSIZE is cut by ZeroMQ
before the server sees it: the closed connection is logged, nothing else
changes. The server's log accounts for every refusal, and afterwards a
real client gets the same tokens as the in-process ``LLM``.

The client side: a fake server (a ROUTER in this process) answers with
garbage before its real answer; the client drops and counts every bad
reply and returns the real one, and gives up after ``timeout_s`` however
much garbage keeps coming.
"""

from __future__ import annotations

import queue
import re
import threading
import time

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from engine import LLM, SamplingParams
from ipc.auth import MAC_BYTES, Authenticator, new_secret, read_key_file
from ipc.engine_messages import (
    AbortRequest,
    EngineStats,
    GenerateRequest,
    RequestAccepted,
    RequestError,
    StatsRequest,
    decode_server_message,
)
from ipc.serde import MAX_MESSAGE_BYTES, encode
from serving.client import EngineClient
from tests.helpers.serve_utils import start_server, stop_server

VALID_MESSAGES = [
    encode(GenerateRequest(request_id="g", prompt_token_ids=[1, 2, 3],
                           sampling_params={"max_tokens": 2})),
    encode(GenerateRequest(request_id="t", prompt="hello")),
    encode(AbortRequest(request_id="g")),
    encode(StatsRequest()),
]
WRONG_TYPES = [
    msgspec.msgpack.encode({"type": "GenerateRequest", "request_id": 5}),
    msgspec.msgpack.encode({"type": "GenerateRequest", "request_id": "x",
                            "prompt_token_ids": [1, "x"]}),
    msgspec.msgpack.encode({"type": "Nope"}),
    msgspec.msgpack.encode([1, 2, 3]),
    encode(RequestAccepted(request_id="r", prompt_token_ids=[1])),  # a server message
    encode(EngineStats(num_running=0, num_waiting=0, num_blocks=0, num_free_blocks=0,
                       kv_usage=0.0, prefix_hit_rate=0.0, num_preemptions=0, num_steps=0,
                       num_prompt_tokens=0, num_generation_tokens=0,
                       num_scheduled_tokens=0)),
]
REFUSAL = re.compile(r"refused a client message \(dropped unread\): (.*?)"
                     r"(?:; (\d+) earlier refusals unlogged)?$", re.MULTILINE)
CLOSED = "a client connection closed"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = start_server(tmp_path_factory.mktemp("fuzz"), "--nproc-per-node", "1", "serve",
                          "--model", "tiny", "--device", "cpu", "--disable-log-stats",
                          env={"TPRUN_LOG_LEVEL": "INFO"})
    yield served
    code, output, leftovers = stop_server(served)
    assert code == 0, output[-3000:]
    assert leftovers == []


class RawPeer:
    """A raw DEALER socket on the server, with the real key for probes.
    Once the server has failed to answer, every later probe fails at once:
    hypothesis replaying examples cannot stretch one hang into many."""

    def __init__(self, endpoint: str, secret: bytes):
        self.silent = False
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.auth = Authenticator.for_client(secret)

    def send(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)

    def replies_until_stats(self) -> tuple[list, EngineStats]:
        """Send a signed StatsRequest; return what came before its answer, and it."""
        if self.silent:
            pytest.fail("the engine stopped answering (see the first failure)")
        self.send(self.auth.seal(encode(StatsRequest())))
        before = []
        while True:
            if not self.socket.poll(10_000):
                self.silent = True
                pytest.fail("the engine did not answer within 10 s")
            reply = decode_server_message(self.auth.unseal(self.socket.recv_multipart()))
            if isinstance(reply, EngineStats):
                return before, reply
            before.append(reply)

    def close(self) -> None:
        self.socket.close()
        self.ctx.term()


@pytest.fixture(scope="module")
def secret(served):
    return read_key_file(served.key_file)


@pytest.fixture(scope="module")
def peer(served, secret):
    peer = RawPeer(served.endpoint, secret)
    yield peer
    peer.close()


def unsigned_messages(secret: bytes) -> st.SearchStrategy[list[bytes]]:
    """Messages without a valid MAC, each as its list of frames."""
    good = Authenticator.for_client(secret)
    payloads = st.sampled_from(VALID_MESSAGES + WRONG_TYPES) | st.binary(max_size=300)
    sealed = payloads.map(good.seal)
    macs = st.binary(min_size=MAC_BYTES, max_size=MAC_BYTES)
    return st.one_of(
        st.binary(max_size=300).map(lambda b: [b]),  # random bytes, no MAC frame
        st.tuples(macs, payloads).map(list),  # a random (wrong) MAC
        st.tuples(sealed, st.data()).map(lambda x: _truncate(*x)),  # MAC of the whole
        sealed.map(lambda f: [f[0][:-1], f[1]]),  # a truncated MAC
        st.tuples(sealed, st.binary(max_size=20)).map(lambda x: [*x[0], x[1]]),  # extra frame
        payloads.map(Authenticator.for_client(new_secret()).seal),  # another key
        payloads.map(Authenticator.for_server(secret).seal),  # a reply reflected back
    )


def _truncate(frames: list[bytes], data: st.DataObject) -> list[bytes]:
    mac, payload = frames
    cut = data.draw(st.integers(0, max(0, len(payload) - 1))) if payload else 0
    return [mac, payload[:cut]] if payload else [mac[:cut]]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_unauthenticated_messages_are_refused_unanswered(served, secret, peer):
    _, start = peer.replies_until_stats()

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(unsigned_messages(secret))
    def check(frames):
        _, before = peer.replies_until_stats()
        peer.send(frames)
        replies, after = peer.replies_until_stats()
        assert replies == [], "a message without a valid MAC was answered"
        assert after.num_refused_messages == before.num_refused_messages + 1
        assert after.num_prompt_tokens == before.num_prompt_tokens  # nothing scheduled
        assert after.num_running == after.num_waiting == 0

    check()
    _, end = peer.replies_until_stats()
    assert end.num_refused_messages > start.num_refused_messages


def signed_garbage() -> st.SearchStrategy[bytes]:
    truncated = st.tuples(st.sampled_from(VALID_MESSAGES), st.data()).map(
        lambda x: x[0][: x[1].draw(st.integers(0, len(x[0]) - 1))])
    return st.one_of(st.binary(max_size=300), truncated, st.sampled_from(WRONG_TYPES))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_signed_garbage_gets_one_error_and_the_engine_keeps_serving(served, peer):
    @settings(max_examples=100, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(signed_garbage())
    def check(payload):
        _, before = peer.replies_until_stats()
        peer.send(peer.auth.seal(payload))
        replies, after = peer.replies_until_stats()
        assert len(replies) == 1 and isinstance(replies[0], RequestError), replies
        assert "malformed request" in replies[0].error
        assert after.num_refused_messages == before.num_refused_messages  # authenticated
        assert after.num_prompt_tokens == before.num_prompt_tokens

    check()


def _lines(served, text: str) -> int:
    return served.output().count(text)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_oversized_frames_are_cut_and_logged(served, secret, peer):
    @settings(max_examples=3, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(1, 4096), st.booleans())
    def check(extra, signed):
        _, before = peer.replies_until_stats()
        closed = _lines(served, CLOSED)
        payload = bytes(MAX_MESSAGE_BYTES + extra)
        frames = Authenticator.for_client(secret).seal(payload) if signed else [payload]
        sender = RawPeer(served.endpoint, secret)
        try:
            sender.send(frames)
            deadline = time.monotonic() + 5  # the sender is still open: a close is the cut
            while _lines(served, CLOSED) == closed and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _lines(served, CLOSED) > closed, "the cut connection was not logged"
        finally:
            sender.close()
        replies, after = peer.replies_until_stats()
        assert replies == []
        assert after.num_refused_messages == before.num_refused_messages  # never seen
        assert after.num_prompt_tokens == before.num_prompt_tokens

    check()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_refusals_add_up_in_the_log_and_real_clients_get_right_answers(served, peer):
    time.sleep(1.1)  # a new logging second: the next refusal is logged with the tally
    peer.send([b"one last unsigned message"])
    _, stats = peer.replies_until_stats()
    refusals = REFUSAL.findall(served.output())
    assert sum(1 + int(unlogged or 0) for _, unlogged in refusals) == stats.num_refused_messages
    assert refusals[-1][0] == "expected 2 frames [mac, payload], got 1"
    prompts = [{"prompt_token_ids": [3 + i, 17, 250 - i, 9]} for i in range(8)] + ["fuzz"]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    with LLM(model="tiny", device="cpu") as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    with EngineClient(served.endpoint_file, timeout_s=60) as client:
        got = [o.outputs[0].token_ids for o in client.generate(prompts, params)]
        after = client.stats()
        assert client.num_dropped_replies == 0
    assert got == want
    assert after.num_running == 0 and after.num_free_blocks == after.num_blocks


# ---- the client side ----------------------------------------------------------
class FakeServer:
    """A ROUTER in a thread: for each client message, it sends the frame
    lists queued in ``garbage`` (one item per request), then a real signed
    ``EngineStats``; or, once ``junk_for_s`` is set, one junk frame every
    20 ms for that long and no answer."""

    def __init__(self, endpoint: str, secret: bytes):
        self.auth = Authenticator.for_server(secret)
        self.garbage: queue.Queue[list[list[bytes]]] = queue.Queue()
        self.junk_for_s = 0.0
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.endpoint = endpoint
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        self.ready.set()
        try:
            while not self.stop.is_set():
                if not sock.poll(50):
                    continue
                identity, *frames = sock.recv_multipart()
                self.auth.unseal(frames)  # the client signs what it sends
                if self.junk_for_s:
                    self._trickle(sock, identity)
                    continue
                for bad in self.garbage.get_nowait():
                    sock.send_multipart([identity, *bad])
                sock.send_multipart([identity, *self.auth.seal(encode(STATS))])
        finally:
            sock.close()
            ctx.term()

    def _trickle(self, sock: zmq.Socket, identity: bytes) -> None:
        end = time.monotonic() + self.junk_for_s
        while time.monotonic() < end and not self.stop.is_set():
            sock.send_multipart([identity, b"junk"])
            time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


STATS = EngineStats(num_running=1, num_waiting=2, num_blocks=3, num_free_blocks=3,
                    kv_usage=0.0, prefix_hit_rate=0.0, num_preemptions=0, num_steps=4,
                    num_prompt_tokens=5, num_generation_tokens=6, num_scheduled_tokens=7)


def garbage_replies(secret: bytes) -> st.SearchStrategy[list[bytes]]:
    """Replies a client must drop: no valid MAC, or a valid MAC on bytes
    that are no server message."""
    server = Authenticator.for_server(secret)
    payloads = st.binary(max_size=200) | st.sampled_from(VALID_MESSAGES + WRONG_TYPES[:4])
    return st.one_of(
        st.binary(max_size=200).map(lambda b: [b]),
        st.tuples(st.binary(min_size=MAC_BYTES, max_size=MAC_BYTES), payloads).map(list),
        st.just(server.seal(encode(STATS))).map(lambda f: [f[0], f[1][:-1]]),
        payloads.map(Authenticator.for_client(secret).seal),  # a request reflected back
        payloads.map(Authenticator.for_server(new_secret()).seal),  # another key
        st.sampled_from(VALID_MESSAGES + WRONG_TYPES[:4]).map(server.seal),  # no reply type
        st.binary(max_size=200).map(server.seal),
    )


@pytest.mark.timeout(60)
def test_client_drops_garbage_replies_from_a_fake_server(tmp_path):
    secret = new_secret()
    fake = FakeServer(f"ipc://{tmp_path}/fake", secret)
    client = EngineClient(f"ipc://{tmp_path}/fake", timeout_s=10, secret=secret)
    try:
        @settings(max_examples=150, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(st.lists(garbage_replies(secret), max_size=4))
        def check(bad):
            dropped = client.num_dropped_replies
            fake.garbage.put(bad)
            assert client.stats() == STATS
            assert client.num_dropped_replies == dropped + len(bad)

        check()
        fake.junk_for_s = 3.0  # garbage only, for longer than the client waits
        client.timeout_s = 0.5
        dropped = client.num_dropped_replies
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            client.stats()
        # the garbage (3 s of it) did not keep it waiting past its own timeout
        assert time.monotonic() - started < client.timeout_s + 2.0
        assert client.num_dropped_replies > dropped
    finally:
        client.close()
        fake.close()
