"""The broadcast channel (PUB -> SUB), the reply channel and the output
channel (both PUSH -> PULL).

The executor binds them all; workers connect. A message is encoded once and
the same bytes go to every subscriber. Malformed bytes are logged and
dropped by the receiver, which keeps serving. ZeroMQ sockets are not
thread-safe: each thread that sends owns its own ``ReplySender``.

The output channel carries the output rank's step outputs straight to the
thread that waits for the step (``OutputReceiver``), so no thread stands
between the socket and that waiter. Whatever else settles a step (the reply
channel's reader: a rank's error, a dead worker) nudges the waiter through
``OutputNudger``: an empty frame on the same socket, which is no message.
"""

from __future__ import annotations

import os
import time

import msgspec
import zmq

from ipc.messages import Broadcast, Hello, Reply, Sync
from ipc.serde import MAX_MESSAGE_BYTES, decode_broadcast, decode_reply, encode


def _restrict_ipc_file(endpoint: str) -> None:
    if endpoint.startswith("ipc://"):
        os.chmod(endpoint[len("ipc://") :], 0o600)


def _recv_decoded(socket: zmq.Socket, timeout_ms: int | None, decode):
    """Receive until a message decodes or ``timeout_ms`` passes (None: wait).

    Uses the socket's receive timeout rather than a poll before each
    receive: one system call less on the hot path.
    """
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    while True:
        wait = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        if socket.getsockopt(zmq.RCVTIMEO) != wait:
            socket.setsockopt(zmq.RCVTIMEO, wait)
        try:
            data = socket.recv(copy=True)
        except zmq.Again:
            return None
        message = decode(data)
        if message is not None:
            return message
        if deadline is not None and time.monotonic() >= deadline:
            return None


class BroadcastPublisher:
    """Executor side of the broadcast channel."""

    def __init__(self, ctx: zmq.Context, endpoint: str):
        self.socket = ctx.socket(zmq.PUB)
        self.socket.setsockopt(zmq.SNDHWM, 0)  # never drop a step
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)
        _restrict_ipc_file(endpoint)

    def publish(self, message: msgspec.Struct) -> None:
        self.socket.send(encode(message), copy=False)

    def close(self) -> None:
        self.socket.close()


class BroadcastSubscriber:
    """Worker side of the broadcast channel."""

    def __init__(self, ctx: zmq.Context, endpoint: str):
        self.socket = ctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(endpoint)

    def recv(self, timeout_ms: int | None = None) -> Broadcast | None:
        """The next well-formed message, or None on timeout."""
        return _recv_decoded(self.socket, timeout_ms, decode_broadcast)

    def close(self) -> None:
        self.socket.close()


def _bound_pull(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """The executor's PULL socket at ``endpoint``: no queue limit (a reply
    is never dropped), messages above MAX_MESSAGE_BYTES refused, owner-only
    ipc file."""
    socket = ctx.socket(zmq.PULL)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(endpoint)
    _restrict_ipc_file(endpoint)
    return socket


class ReplyReceiver:
    """Executor side of the reply channel."""

    def __init__(self, ctx: zmq.Context, endpoint: str):
        self.socket = _bound_pull(ctx, endpoint)

    def recv(self, timeout_ms: int) -> Reply | None:
        """The next well-formed reply, or None on timeout."""
        return _recv_decoded(self.socket, timeout_ms, decode_reply)

    def close(self) -> None:
        self.socket.close()


class OutputReceiver:
    """Executor side of the output channel: bound at ``endpoint`` (the
    output rank connects) and at ``nudge_address`` (``inproc://``, in the
    same context: ``OutputNudger``). Read by one thread at a time."""

    def __init__(self, ctx: zmq.Context, endpoint: str, nudge_address: str):
        self.socket = _bound_pull(ctx, endpoint)
        self.socket.bind(nudge_address)

    def recv(self, timeout_ms: int) -> Reply | None:
        """The next well-formed reply; None once ``timeout_ms`` has passed
        or a nudge came (either way: look at what you wait for again)."""
        message = _recv_decoded(self.socket, timeout_ms, _decode_output)
        return None if message is _NUDGE else message

    def close(self) -> None:
        self.socket.close()


class OutputNudger:
    """Wakes the thread reading an ``OutputReceiver`` (one thread sends)."""

    def __init__(self, ctx: zmq.Context, nudge_address: str):
        self.socket = ctx.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(nudge_address)

    def nudge(self) -> None:
        self.socket.send(b"", zmq.NOBLOCK)

    def close(self) -> None:
        self.socket.close()


_NUDGE = object()


def _decode_output(data: bytes):
    """A reply, ``_NUDGE`` for the empty frame (no encoded message is
    empty), or None (malformed: logged and dropped)."""
    return _NUDGE if not data else decode_reply(data)


class ReplySender:
    """Worker side of the reply channel (one per sending thread)."""

    def __init__(self, ctx: zmq.Context, endpoint: str):
        self.socket = ctx.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.connect(endpoint)

    def send(self, message: msgspec.Struct) -> None:
        self.socket.send(encode(message), copy=False)

    def close(self) -> None:
        self.socket.close()


def wait_for_subscribers(
    publisher: BroadcastPublisher,
    receiver: ReplyReceiver,
    world_size: int,
    timeout_s: float,
    check_alive=lambda: None,
) -> dict[int, int]:
    """Start-up handshake: publish ``Sync`` until every rank acknowledges it.

    A rank that answers a ``Sync`` is subscribed, so no later broadcast can
    be lost to a late joiner. Returns {rank: pid}. ``check_alive`` may raise
    to abort early (a worker died). Raises TimeoutError naming missing ranks.
    A worker of a rank outside ``world_size`` (started elsewhere, more of
    them than the executor runs) would be counted for a rank it is not:
    ValueError naming it, once it and every rank are subscribed, so the
    executor's shutdown call that follows reaches them all.
    """
    deadline = time.monotonic() + timeout_s
    pids: dict[int, int] = {}
    synced: set[int] = set()
    ranks = set(range(world_size))
    sync_id = 0
    while not ranks <= synced or not set(pids) <= synced:
        if time.monotonic() > deadline:
            missing = sorted(ranks - synced)
            raise TimeoutError(f"workers of ranks {missing} did not connect within {timeout_s}s")
        check_alive()
        sync_id += 1
        publisher.publish(Sync(sync_id=sync_id))
        end = time.monotonic() + 0.05
        while (left := end - time.monotonic()) > 0:
            reply = receiver.recv(timeout_ms=int(left * 1000) + 1)
            if isinstance(reply, Hello):
                pids[reply.rank] = reply.pid
                if reply.sync_id > 0:
                    synced.add(reply.rank)
    if strays := sorted(set(pids) - ranks):
        raise ValueError(f"workers say they are ranks {strays} (pids "
                         f"{[pids[r] for r in strays]}); this executor runs {world_size} ranks, "
                         f"0..{world_size - 1}: start {world_size} workers (torchrun "
                         f"--nproc-per-node {world_size})")
    return pids
