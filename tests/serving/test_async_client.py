"""``AsyncEngineClient`` against a hand-driven ROUTER (no engine): the
in-process address (``inproc://`` in a shared context, as ``tprun serve``'s
front end uses it) and an ipc:// one, the replies it must route, the forged
ones it must drop, a burst longer than one callback's reads, and a reply
that arrives while the event loop is busy and then sends (the send may take
the descriptor's edge: the reply must still arrive)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import zmq

from ipc.auth import Authenticator, new_secret
from ipc.engine_messages import (
    Delta,
    GenerateRequest,
    Outputs,
    RequestAccepted,
    decode_client_message,
)
from ipc.serde import encode
from serving.async_client import AsyncEngineClient

TIMEOUT_S = 10


class FakeEngine:
    """A ROUTER that reads the client's sealed requests and answers by hand."""

    def __init__(self, ctx: zmq.Context, address: str, secret: bytes):
        self.auth = Authenticator.for_server(secret)
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(address)
        self.identity: bytes | None = None

    def receive(self) -> GenerateRequest:
        assert self.socket.poll(TIMEOUT_S * 1000), "no request reached the engine"
        self.identity, *frames = self.socket.recv_multipart()
        return decode_client_message(self.auth.unseal(frames))

    def reply(self, message, forged: bool = False) -> None:
        frames = self.auth.seal(encode(message))
        if forged:
            frames[0] = bytes(32)
        self.socket.send_multipart([self.identity, *frames])

    def close(self) -> None:
        self.socket.close()


def delta(rid: str, token: int) -> Outputs:
    return Outputs(deltas=[Delta(request_id=rid, token_ids=[token], text=str(token),
                                 finished=False)])


async def next_item(queue: asyncio.Queue):
    return await asyncio.wait_for(queue.get(), TIMEOUT_S)


@pytest.fixture(params=["inproc", "ipc"])
def link(request, tmp_path):
    """(fake engine, client not yet started, the shared context or None)."""
    secret = new_secret()
    ctx = zmq.Context()
    if request.param == "inproc":
        address, shared = "inproc://test-engine", ctx
    else:
        address, shared = f"ipc://{tmp_path}/engine", None
    engine = FakeEngine(ctx, address, secret)
    client = AsyncEngineClient(address, secret, context=shared)
    yield engine, client, shared
    engine.close()
    ctx.term()


def test_requests_and_replies_are_routed_and_forged_replies_dropped(link):
    engine, client, shared = link

    async def main():
        await client.start()
        try:
            queue: asyncio.Queue = asyncio.Queue()
            client.submit("r1", [5, 6, 7], {"max_tokens": 3}, queue)
            request = await asyncio.to_thread(engine.receive)
            assert (request.request_id, request.prompt_token_ids) == ("r1", [5, 6, 7])
            assert request.sampling_params == {"max_tokens": 3}
            engine.reply(RequestAccepted(request_id="r1", prompt_token_ids=[5, 6, 7]))
            engine.reply(delta("r1", 99), forged=True)
            engine.reply(delta("r1", 11))
            accepted = await next_item(queue)
            assert isinstance(accepted, RequestAccepted)
            assert (await next_item(queue)).token_ids == [11]
            assert queue.empty()
            assert client.protocol.dropped.count == 1
        finally:
            await client.close()
        assert shared is None or not shared.closed  # a shared context is its owner's

    asyncio.run(main())


def test_a_burst_longer_than_one_callback_arrives_whole_and_in_order(link):
    engine, client, _ = link
    n = 3 * AsyncEngineClient.MAX_READS_PER_WAKE + 5

    async def main():
        await client.start()
        try:
            queue: asyncio.Queue = asyncio.Queue()
            client.submit("r1", [1], {}, queue)
            await asyncio.to_thread(engine.receive)
            for i in range(n):
                engine.reply(delta("r1", i))
            assert [(await next_item(queue)).token_ids[0] for _ in range(n)] == list(range(n))
        finally:
            await client.close()

    asyncio.run(main())


def test_a_reply_that_arrives_while_the_loop_is_busy_survives_a_send(link):
    engine, client, _ = link

    async def main():
        await client.start()
        try:
            first: asyncio.Queue = asyncio.Queue()
            client.submit("r1", [1], {}, first)
            await asyncio.to_thread(engine.receive)
            await asyncio.sleep(0.05)  # the loop has drained: nothing waits
            engine.reply(delta("r1", 42))
            time.sleep(0.2)  # the loop is busy while the reply arrives...
            client.submit("r2", [2], {}, asyncio.Queue())  # ...and sends before it looks
            assert (await next_item(first)).token_ids == [42]
            assert (await asyncio.to_thread(engine.receive)).request_id == "r2"
        finally:
            await client.close()

    asyncio.run(main())


def test_close_removes_the_reader_and_owned_context(tmp_path):
    secret = new_secret()
    ctx = zmq.Context()
    engine = FakeEngine(ctx, f"ipc://{tmp_path}/engine", secret)
    client = AsyncEngineClient(f"ipc://{tmp_path}/engine", secret)

    async def main():
        await client.start()
        fd = client.fd
        await client.close()
        loop = asyncio.get_running_loop()
        assert not loop.remove_reader(fd)  # already removed
        assert client.ctx.closed

    try:
        asyncio.run(main())
    finally:
        engine.close()
        ctx.term()
    assert os.path.exists(tmp_path)
