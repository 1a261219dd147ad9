"""Malformed bytes on every socket are dropped and logged; receivers keep serving."""

import logging
import os
import random
import tempfile
import threading

import msgspec
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint.tiny_model import ensure_tiny_model
from executor.multiproc import MultiprocExecutor
from ipc import channels
from ipc.channels import BroadcastSubscriber, ReplySender
from ipc.endpoints import Endpoints
from ipc.messages import (
    CachedRequestData,
    ControlCall,
    ControlReply,
    Heartbeat,
    Hello,
    NewRequestData,
    SamplingOptions,
    SchedulerOutput,
    Sync,
    WorkerError,
)
from ipc.serde import decode_broadcast, decode_reply, encode
from tests.helpers.checkpoints import runner_config


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_decoders_never_raise_on_random_bytes(data):
    for decode in (decode_broadcast, decode_reply):
        message = decode(data)
        assert message is None or isinstance(message, msgspec.Struct)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=200))
def test_truncated_messages_are_dropped(cut):
    plan = SchedulerOutput(step_id=7, scheduled_cached_reqs=CachedRequestData(
        req_ids=["a" * 50], new_block_ids=[None]), num_scheduled_tokens=[3])
    data = encode(plan)
    truncated = data[: min(cut, len(data) - 1)]
    assert decode_broadcast(truncated) is None


def test_wrong_types_are_dropped():
    bad_step = msgspec.msgpack.encode({"type": "SchedulerOutput", "step_id": "x"})
    assert decode_broadcast(bad_step) is None
    missing = msgspec.msgpack.encode({"type": "ModelRunnerOutput", "step_id": 1})
    assert decode_reply(missing) is None
    assert decode_broadcast(msgspec.msgpack.encode([1, 2, 3])) is None


def _plan(step_id: int, req_id: str) -> SchedulerOutput:
    new = NewRequestData(req_id=req_id, prompt_token_ids=[5, 6, 7], prefill_token_ids=[5, 6, 7],
                         sampling=SamplingOptions(temperature=0.0), block_ids=[[step_id]],
                         num_computed_tokens=0, max_tokens=4)
    return SchedulerOutput(step_id=step_id, scheduled_new_reqs=[new],
                           num_scheduled_tokens=[3],
                           finished_req_ids=[f"r{step_id - 1}"] if step_id else [])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_live_workers_and_executor_survive_garbage(tmp_path, monkeypatch):
    monkeypatch.setattr(channels, "MAX_MESSAGE_BYTES", 1 << 20)
    tiny = ensure_tiny_model(str(tmp_path))
    executor = MultiprocExecutor(2, "cpu")
    rogue_ctx = zmq.Context()
    rogue = rogue_ctx.socket(zmq.PUSH)
    rogue.setsockopt(zmq.LINGER, 0)
    try:
        executor.initialize(runner_config(tiny, max_num_seqs=4, max_num_batched_tokens=64,
                                          max_model_len=128), 16)
        rogue.connect(executor.endpoints.reply)
        rng = random.Random(0)
        tokens = []
        for step in range(6):
            for _ in range(5):  # junk on the broadcast channel, before each step
                executor.publisher.socket.send(rng.randbytes(rng.randint(0, 300)))
            rogue.send(rng.randbytes(rng.randint(0, 300)))  # junk on the reply channel
            rogue.send(encode(SchedulerOutput(step_id=99)))  # a wrong-type reply
            if step == 2:
                rogue.send(b"x" * (2 << 20))  # oversized: ZeroMQ drops it (and the peer)
            out = executor.execute_model(_plan(step, f"r{step}")).result(timeout=30)
            tokens.append(out.rows()[0])
        # The same prompt each time: the same greedy token each time.
        assert all(len(t) == 1 for t in tokens) and len({t[0] for t in tokens}) == 1
        assert all(p.poll() is None for p in executor.procs)
    finally:
        rogue.close()
        rogue_ctx.term()
        executor.shutdown()
    assert not os.path.exists(executor.endpoints.directory)


def _fake_worker(ctx, endpoints, rank: int, forge: bool, rank0_sent: threading.Event) -> None:
    """A worker in a thread: answers the handshake and every control call
    with ``{"rank": rank, **kwargs}``. With ``forge`` it also sends, on its
    own socket, replies no worker of a world of 2 sends: ranks outside
    0..1, and a second answer of rank 0 to the same call."""
    sub = BroadcastSubscriber(ctx, endpoints.broadcast)
    push = ReplySender(ctx, endpoints.reply)
    push.send(Hello(rank=rank, pid=os.getpid()))
    if forge:  # during the handshake
        push.send(ControlReply(call_id=0, rank=5, result="forged"))
        push.send(Heartbeat(rank=9, step_started=0, step_finished=0))
    while (msg := sub.recv(timeout_ms=10_000)) is not None:
        if isinstance(msg, Sync):
            push.send(Hello(rank=rank, pid=os.getpid(), sync_id=msg.sync_id))
        elif isinstance(msg, ControlCall) and msg.method == "shutdown":
            break
        elif isinstance(msg, ControlCall) and forge:
            push.send(ControlReply(call_id=msg.call_id, rank=5, result="forged"))
            push.send(ControlReply(call_id=msg.call_id, rank=-1, error="forged"))
            push.send(WorkerError(rank=7, step_id=0, error="forged", fatal=True))
            push.send(Heartbeat(rank=2, step_started=0, step_finished=0))
            push.send(ControlReply(call_id=msg.call_id, rank=rank, result={"rank": rank, **msg.kwargs}))
            push.send(ControlReply(call_id=msg.call_id, rank=rank, result="forged second"))
            rank0_sent.set()
        elif isinstance(msg, ControlCall):
            rank0_sent.wait(timeout=5)
            rank0_sent.clear()
            push.send(ControlReply(call_id=msg.call_id, rank=rank, result={"rank": rank, **msg.kwargs}))
    sub.close()
    push.close()


@pytest.mark.timeout(60)
def test_replies_forged_for_other_ranks_are_dropped_and_calls_complete(caplog):
    """Replies that decode but name a rank outside the world (or answer a
    call twice) reach the reply channel during the handshake and during
    control calls: each is dropped with a warning naming it; the reader
    thread goes on, and every call returns the two workers' own answers."""
    caplog.set_level(logging.WARNING, logger="executor.multiproc")
    attach_dir = os.path.join(tempfile.mkdtemp(), "s")
    rank0_sent = threading.Event()
    ctx = zmq.Context()
    threads = []
    executor = None
    try:
        endpoints = Endpoints.create(attach_dir)
        threads = [threading.Thread(target=_fake_worker, daemon=True,
                                    args=(ctx, endpoints, rank, rank == 0, rank0_sent))
                   for rank in (0, 1)]
        for t in threads:
            t.start()
        executor = MultiprocExecutor(2, "cpu", attach_dir=attach_dir, start_timeout_s=20)
        for x in range(3):
            got = executor.collective_rpc("echo", {"x": x}, timeout=20)
            assert got == [{"rank": 0, "x": x}, {"rank": 1, "x": x}]
        assert executor.reader.is_alive()
        executor.check_health()
        messages = [r.getMessage() for r in caplog.records]
        for line in ("dropped a ControlReply from rank 5: this executor runs ranks 0..1",
                     "dropped a ControlReply from rank -1: this executor runs ranks 0..1",
                     "dropped a WorkerError from rank 7: this executor runs ranks 0..1",
                     "dropped a Heartbeat from rank 2: this executor runs ranks 0..1"):
            assert line in messages
    finally:
        if executor is not None:
            executor.shutdown()
        for t in threads:
            t.join(timeout=15)
        ctx.term()
    assert not any(t.is_alive() for t in threads)
