"""Messages, channels and the start-up handshake (no model)."""

import os
import tempfile
import threading

import msgspec
import pytest
import zmq

from ipc.channels import (
    BroadcastPublisher,
    BroadcastSubscriber,
    OutputNudger,
    OutputReceiver,
    ReplyReceiver,
    ReplySender,
    wait_for_subscribers,
)
from ipc.endpoints import IPC_PATH_MAX, Endpoints
from ipc.engine_messages import Delta, Outputs, decode_server_message
from ipc.messages import (
    CachedRequestData,
    ControlCall,
    Hello,
    ModelRunnerOutput,
    NewRequestData,
    SamplingOptions,
    SchedulerOutput,
    Sync,
)
from ipc.serde import decode_broadcast, decode_reply, encode
from tests.helpers.proc_utils import long_directory, socket_dirs


def _plan() -> SchedulerOutput:
    new = NewRequestData(req_id="a", prompt_token_ids=[1, 2], prefill_token_ids=[1, 2, 3],
                         sampling=SamplingOptions(temperature=0.5, seed=7), block_ids=[[4]],
                         num_computed_tokens=0, max_tokens=5)
    cached = CachedRequestData(req_ids=["b"], new_block_ids=[[[9]]])
    return SchedulerOutput(step_id=3, scheduled_new_reqs=[new], scheduled_cached_reqs=cached,
                           num_scheduled_tokens=[1, 3],
                           finished_req_ids=["c"], preempted_req_ids=["d"])


def test_a_plan_is_empty_only_without_any_request():
    """Each of scheduled new, scheduled cached, finished and preempted
    requests alone makes a plan non-empty; a structured-output list alone
    cannot (it names scheduled requests)."""
    full = _plan()
    assert SchedulerOutput(step_id=1).is_empty()
    assert SchedulerOutput(step_id=1, structured_output_req_ids=[]).is_empty()
    assert not full.is_empty()
    assert not SchedulerOutput(step_id=1, scheduled_new_reqs=full.scheduled_new_reqs,
                               num_scheduled_tokens=[3]).is_empty()
    assert not SchedulerOutput(step_id=1, scheduled_cached_reqs=full.scheduled_cached_reqs,
                               num_scheduled_tokens=[1]).is_empty()
    assert not SchedulerOutput(step_id=1, finished_req_ids=["c"]).is_empty()
    assert not SchedulerOutput(step_id=1, preempted_req_ids=["d"]).is_empty()


def test_round_trip_is_exact():
    plan = _plan()
    assert decode_broadcast(encode(plan)) == plan
    out = ModelRunnerOutput(step_id=3, sampled_token_ids=[5], num_sampled=[1, 0])
    assert decode_reply(encode(out)) == out
    assert out.rows() == [[5], []]
    decode = ModelRunnerOutput(step_id=4, sampled_token_ids=[5, 6])
    assert decode_reply(encode(decode)).rows() == [[5], [6]]


def test_fields_at_their_defaults_stay_off_the_wire():
    """A decode step's delta, reply and plan carry only the fields set, and
    each decodes equal to what was sent (the absent fields take their
    defaults)."""
    delta = Delta(request_id="r", token_ids=[7], text=" a", finished=False)
    outputs = Outputs(deltas=[delta])
    assert msgspec.msgpack.decode(encode(outputs))["deltas"] == [
        {"request_id": "r", "token_ids": [7], "text": " a", "finished": False}]
    assert decode_server_message(encode(outputs)) == outputs
    reply = ModelRunnerOutput(step_id=4, sampled_token_ids=[5, 6])
    assert set(msgspec.msgpack.decode(encode(reply))) == {"type", "step_id", "sampled_token_ids"}
    assert decode_reply(encode(reply)) == reply
    plan = SchedulerOutput(step_id=2, scheduled_cached_reqs=CachedRequestData(
        req_ids=["b"], new_block_ids=[None]), num_scheduled_tokens=[1])
    raw = msgspec.msgpack.decode(encode(plan))
    assert set(raw) == {"type", "step_id", "scheduled_cached_reqs", "num_scheduled_tokens"}
    assert set(raw["scheduled_cached_reqs"]) == {"req_ids", "new_block_ids"}
    assert decode_broadcast(encode(plan)) == plan


def test_reply_rows_reject_counts_that_do_not_add_up():
    with pytest.raises(ValueError, match="adds up to 3"):
        ModelRunnerOutput(step_id=1, sampled_token_ids=[5, 6], num_sampled=[1, 2]).rows()


@pytest.mark.parametrize("junk", [b"", b"\x00\x01garbage", b"\x81\xa4type\xa3Foo",
                                  encode(Hello(rank=0, pid=1))])
def test_malformed_or_wrong_type_is_dropped(junk):
    assert decode_broadcast(junk) is None


def test_endpoints_are_private():
    endpoints = Endpoints.create()
    try:
        assert os.stat(endpoints.directory).st_mode & 0o777 == 0o700
        assert endpoints.broadcast.startswith("ipc://")
        assert endpoints.output == f"ipc://{endpoints.directory}/output"
    finally:
        endpoints.cleanup()
    assert not os.path.exists(endpoints.directory)


def test_socket_directory_too_long_for_an_address_is_refused_and_removed(tmp_path, monkeypatch):
    """ZeroMQ cannot bind an ipc:// path longer than a Unix socket address:
    a TMPDIR that long gets a message that names it, and no directory stays."""
    tmp = long_directory(tmp_path, IPC_PATH_MAX - len("/tprun-1234567-abcdefgh/broadcast") + 8)
    os.makedirs(tmp)
    monkeypatch.setattr(tempfile, "tempdir", tmp)
    with pytest.raises(ValueError, match=f"more than the {IPC_PATH_MAX}.*TMPDIR"):
        Endpoints.create()
    assert socket_dirs(tmp) == []
    attach = long_directory(tmp_path, IPC_PATH_MAX - len("/broadcast") + 1)
    with pytest.raises(ValueError, match=f"{attach}/broadcast is {IPC_PATH_MAX + 1} bytes"):
        Endpoints.create(attach)
    assert not os.path.exists(attach)


def test_socket_directory_of_the_longest_address_binds(tmp_path):
    """The limit is the address's, not lower: a path of exactly
    ``IPC_PATH_MAX`` bytes binds, and the executor's three sockets work."""
    attach = long_directory(tmp_path, IPC_PATH_MAX - len("/broadcast"))
    endpoints = Endpoints.create(attach)
    ctx = zmq.Context()
    try:
        publisher = BroadcastPublisher(ctx, endpoints.broadcast)
        publisher.close()
    finally:
        ctx.term()
        endpoints.cleanup()


@pytest.mark.timeout(20)
def test_output_channel_replies_nudges_and_junk():
    endpoints = Endpoints.create()
    ctx = zmq.Context()
    receiver = OutputReceiver(ctx, endpoints.output, "inproc://test-output-nudge")
    nudger = OutputNudger(ctx, "inproc://test-output-nudge")
    push = ReplySender(ctx, endpoints.output)
    try:
        assert oct(os.stat(endpoints.output[len("ipc://"):]).st_mode & 0o777) == "0o600"
        nudger.nudge()
        assert receiver.recv(timeout_ms=60_000) is None  # a nudge is no message
        push.socket.send(b"\xc1 not msgpack")  # dropped; the next reply comes through
        out = ModelRunnerOutput(step_id=2, sampled_token_ids=[3])
        push.send(out)
        assert receiver.recv(timeout_ms=60_000) == out
        assert receiver.recv(timeout_ms=1) is None  # nothing left
    finally:
        push.close()
        nudger.close()
        receiver.close()
        ctx.term()
        endpoints.cleanup()
    assert not os.path.exists(endpoints.directory)


@pytest.mark.timeout(30)
def test_handshake_then_no_message_lost_and_junk_skipped():
    endpoints = Endpoints.create()
    ctx = zmq.Context()
    pub = BroadcastPublisher(ctx, endpoints.broadcast)
    pull = ReplyReceiver(ctx, endpoints.reply)
    received: dict[int, list] = {0: [], 1: []}

    def fake_worker(rank: int) -> None:
        sub = BroadcastSubscriber(ctx, endpoints.broadcast)
        push = ReplySender(ctx, endpoints.reply)
        push.send(Hello(rank=rank, pid=os.getpid()))
        while True:
            msg = sub.recv(timeout_ms=5000)
            if isinstance(msg, Sync):
                push.send(Hello(rank=rank, pid=os.getpid(), sync_id=msg.sync_id))
            elif isinstance(msg, SchedulerOutput):
                received[rank].append(msg.step_id)
                if msg.step_id == 9:
                    break
        sub.close()
        push.close()

    threads = [threading.Thread(target=fake_worker, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    try:
        pids = wait_for_subscribers(pub, pull, 2, timeout_s=10)
        assert set(pids) == {0, 1}
        for step in range(10):
            pub.socket.send(b"\xc1 not msgpack")  # junk between steps is skipped
            pub.publish(SchedulerOutput(step_id=step))
        for t in threads:
            t.join(timeout=10)
        assert received == {0: list(range(10)), 1: list(range(10))}
    finally:
        pub.close()
        pull.close()
        ctx.term()
        endpoints.cleanup()


@pytest.mark.timeout(30)
def test_handshake_refuses_workers_of_ranks_outside_the_world_and_reaches_them_all():
    """Workers started elsewhere, more than the executor runs (torchrun
    --nproc-per-node 3 for an executor of 2): refused by name, once every
    one is subscribed, so the shutdown call that follows reaches all three
    (they are torchrun's: nothing else would stop them)."""
    endpoints = Endpoints.create()
    ctx = zmq.Context()
    pub = BroadcastPublisher(ctx, endpoints.broadcast)
    pull = ReplyReceiver(ctx, endpoints.reply)
    stopped = []

    def fake_worker(rank: int) -> None:
        sub = BroadcastSubscriber(ctx, endpoints.broadcast)
        push = ReplySender(ctx, endpoints.reply)
        push.send(Hello(rank=rank, pid=1000 + rank))
        while (msg := sub.recv(timeout_ms=5000)) is not None:
            if isinstance(msg, Sync):
                push.send(Hello(rank=rank, pid=1000 + rank, sync_id=msg.sync_id))
            elif isinstance(msg, ControlCall) and msg.method == "shutdown":
                stopped.append(rank)
                break
        sub.close()
        push.close()

    threads = [threading.Thread(target=fake_worker, args=(r,)) for r in (0, 1, 2)]
    for t in threads:
        t.start()
    try:
        with pytest.raises(ValueError, match=r"workers say they are ranks \[2\] \(pids "
                                             r"\[1002\]\); this executor runs 2 ranks, 0\.\.1: "
                                             r"start 2 workers"):
            wait_for_subscribers(pub, pull, 2, timeout_s=10)
        pub.publish(ControlCall(call_id=-1, method="shutdown"))  # as the executor's shutdown
        for t in threads:
            t.join(timeout=10)
        assert sorted(stopped) == [0, 1, 2]
    finally:
        pub.close()
        pull.close()
        ctx.term()
        endpoints.cleanup()


@pytest.mark.timeout(10)
def test_handshake_times_out_naming_missing_ranks():
    endpoints = Endpoints.create()
    ctx = zmq.Context()
    pub = BroadcastPublisher(ctx, endpoints.broadcast)
    pull = ReplyReceiver(ctx, endpoints.reply)
    try:
        with pytest.raises(TimeoutError, match=r"\[0, 1\]"):
            wait_for_subscribers(pub, pull, 2, timeout_s=0.5)
    finally:
        pub.close()
        pull.close()
        ctx.term()
        endpoints.cleanup()
