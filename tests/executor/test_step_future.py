"""StepFuture and OutputPump: the waiting thread reads the output channel
itself; whatever another thread settles reaches it through a nudge (no
worker processes: a PUSH socket plays the output rank)."""

import threading

import pytest
import zmq

from executor import step_future
from executor.step_future import OutputPump, StepFuture
from ipc.channels import OutputNudger, OutputReceiver, ReplySender
from ipc.endpoints import Endpoints
from ipc.messages import ModelRunnerOutput, WorkerError


@pytest.fixture
def channel():
    """(pump, output rank's sender, nudger, futures by step id, reader threads)."""
    endpoints = Endpoints.create()
    ctx = zmq.Context()
    address = "inproc://test-step-nudge"
    futures: dict[int, StepFuture] = {}
    readers: list[int] = []

    def on_reply(reply):
        readers.append(threading.get_ident())
        future = futures.pop(reply.step_id)
        if isinstance(reply, WorkerError):
            future.set_exception(RuntimeError(reply.error))
        else:
            future.set_result(reply)

    pump = OutputPump(OutputReceiver(ctx, endpoints.output, address), on_reply)
    sender = ReplySender(ctx, endpoints.output)
    nudger = OutputNudger(ctx, address)
    try:
        yield pump, sender, nudger, futures, readers
    finally:
        sender.close()
        nudger.close()
        pump.receiver.close()
        ctx.term()
        endpoints.cleanup()


def _future(pump, futures, step_id: int) -> StepFuture:
    futures[step_id] = StepFuture(pump)
    return futures[step_id]


@pytest.mark.timeout(30)
def test_the_waiting_thread_reads_its_output_itself(channel):
    pump, sender, _, futures, readers = channel
    future = _future(pump, futures, 4)
    sender.send(ModelRunnerOutput(step_id=4, sampled_token_ids=[7]))
    assert future.result(timeout=20).sampled_token_ids == [7]
    assert readers == [threading.get_ident()]  # no other thread stood between


@pytest.mark.timeout(30)
def test_a_later_steps_waiter_settles_the_earlier_step_too(channel):
    pump, sender, _, futures, _ = channel
    first, second = _future(pump, futures, 1), _future(pump, futures, 2)
    sender.send(ModelRunnerOutput(step_id=1, sampled_token_ids=[5]))
    sender.send(ModelRunnerOutput(step_id=2, sampled_token_ids=[6]))
    assert second.result(timeout=20).sampled_token_ids == [6]
    assert first.done() and first.result().sampled_token_ids == [5]


@pytest.mark.timeout(30)
def test_a_step_error_on_the_channel_raises_from_result(channel):
    pump, sender, _, futures, _ = channel
    future = _future(pump, futures, 3)
    sender.send(WorkerError(rank=0, step_id=3, error="boom"))
    with pytest.raises(RuntimeError, match="boom"):
        future.result(timeout=20)


@pytest.mark.timeout(20)
def test_a_nudge_wakes_a_waiter_whose_step_another_thread_settled(channel, monkeypatch):
    # Reads block for up to an hour: only the nudge can end this wait in time.
    monkeypatch.setattr(step_future, "SLICE_MS", 3_600_000)
    pump, _, nudger, futures, _ = channel
    future = _future(pump, futures, 8)
    blocked = threading.Event()
    original = pump.receiver.recv

    def recv(timeout_ms):
        blocked.set()
        return original(timeout_ms)

    pump.receiver.recv = recv

    def settle_elsewhere():
        blocked.wait(10)
        futures.pop(8).set_exception(RuntimeError("rank 1 died"))
        nudger.nudge()

    thread = threading.Thread(target=settle_elsewhere)
    thread.start()
    with pytest.raises(RuntimeError, match="rank 1 died"):
        future.result()
    thread.join(timeout=10)


@pytest.mark.timeout(20)
def test_result_times_out_when_no_output_comes(channel):
    pump, _, _, futures, _ = channel
    future = _future(pump, futures, 9)
    with pytest.raises(TimeoutError):
        future.result(timeout=0.05)
    assert not future.done()


def test_a_settled_future_does_not_touch_the_socket(channel):
    pump, _, _, futures, _ = channel
    future = _future(pump, futures, 5)
    pump.receiver.recv = None  # any read would fail
    future.set_result("ready")
    assert future.result() == "ready"
