"""Malformed bytes on every socket are dropped and logged; receivers keep serving."""

import os
import random

import msgspec
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint.tiny_model import ensure_tiny_model
from executor.multiproc import MultiprocExecutor
from ipc import channels
from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
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
