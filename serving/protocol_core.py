"""The client side of the engine endpoint's protocol, without any I/O.

Both faces, the blocking ``serving.client.EngineClient`` and the asyncio
``serving.async_client.AsyncEngineClient``, own a DEALER socket and hand
every frame they send or receive to one ``ClientProtocol``: it seals
outgoing messages, opens incoming ones (a reply without a valid MAC, or one
that does not decode, is dropped, counted and logged; it never reaches a
request) and routes each message to the sink of the request it names. A
sink is any callable taking one item; a face chooses what it is (a deque's
``append``, an asyncio queue's ``put_nowait``).

Invariants: a request's sink receives its ``RequestAccepted`` or
``RequestError`` and then its ``Delta`` items, in the engine's order. After
``EngineStopped``, ``stopped`` holds the reason, every sink still routed
receives that ``EngineStopped`` once, no sink stays routed, and every later
``seal`` of a request raises ``EngineStoppedError``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from ipc.auth import Authenticator, AuthError, RefusalLog
from ipc.engine_messages import (
    ControlDone,
    EngineStats,
    EngineStopped,
    Outputs,
    RequestAccepted,
    RequestError,
    ServerMessage,
    decode_server_message,
)
from ipc.errors import InvalidRequestError
from ipc.serde import MAX_MESSAGE_BYTES, encode

logger = logging.getLogger(__name__)

Sink = Callable[[object], None]


class EngineStoppedError(RuntimeError):
    """The engine stopped (shut down, a worker died) or does not answer,
    with requests of this client still running; HTTP answers 503."""

    def client_message(self) -> str:
        """What an HTTP client is told: the first line of the reason (a
        worker's traceback stays in the engine's log)."""
        reason = str(self).splitlines()[0] if str(self) else "no reason given"
        return f"the engine stopped: {reason}"


def configure_dealer(socket: zmq.Socket, endpoint: str) -> None:
    """Unbounded queues (a send never waits, so an abort can be sent from
    anywhere) and the one message size bound, then connect."""
    for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0),
                          (zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)):
        socket.setsockopt(option, value)
    socket.connect(endpoint)


class ClientProtocol:
    """Sealing, opening and routing for one client of the engine endpoint.

    ``on_stats`` receives every ``EngineStats``; ``on_control`` every
    ``ControlDone`` (dropped, and counted, without one); ``on_unreadable`` the text
    of a ``RequestError`` that names no request (the engine could not read
    a message of this client); ``on_stopped`` the reason the engine stopped,
    after the sinks have heard it."""

    def __init__(self, secret: bytes, on_stats: Callable[[EngineStats], None],
                 on_unreadable: Callable[[str], None],
                 on_stopped: Callable[[str], None] = lambda reason: None,
                 on_control: Callable[[ControlDone], None] | None = None):
        self.auth = Authenticator.for_client(secret)
        self.on_control = on_control
        self.dropped = RefusalLog(logger, "a reply from the engine")
        self.on_stats = on_stats
        self.on_unreadable = on_unreadable
        self.on_stopped = on_stopped
        self.sinks: dict[str, Sink] = {}
        self.stopped: str | None = None  # why the engine stopped, once it says so
        # Deltas for no routed request: of requests the client abandoned.
        self.num_unrouted_deltas = 0

    # ---- out -----------------------------------------------------------------
    def seal(self, message) -> list[bytes]:
        """The frames of ``message``; ``InvalidRequestError`` for one the
        engine's socket would drop unseen for its size (a request too big)."""
        payload = encode(message)
        if len(payload) > MAX_MESSAGE_BYTES:
            raise InvalidRequestError(f"the request is {len(payload)} bytes; the engine takes "
                                      f"at most {MAX_MESSAGE_BYTES} per message")
        return self.auth.seal(payload)

    def route(self, request_id: str, sink: Sink) -> None:
        """Send the replies about ``request_id`` to ``sink`` from now on."""
        if self.stopped is not None:
            raise EngineStoppedError(self.stopped)
        self.sinks[request_id] = sink

    def unroute(self, request_id: str) -> bool:
        """Drop the request's route; whether it had one."""
        return self.sinks.pop(request_id, None) is not None

    # ---- in ------------------------------------------------------------------
    def receive(self, frames: list[bytes]) -> bool:
        """Open ``frames`` and route the message they hold; whether they
        held one (False: dropped)."""
        message = self.open(frames)
        if message is not None:
            self.dispatch(message)
        return message is not None

    def open(self, frames: list[bytes]) -> ServerMessage | None:
        """The message in ``frames``, or None (dropped, counted, logged)."""
        try:
            return decode_server_message(self.auth.unseal(frames))
        except AuthError as e:
            self.dropped.refuse(str(e))
        except ValueError as e:
            self.dropped.refuse(f"a valid MAC, but {e}")
        return None

    def dispatch(self, message: ServerMessage) -> None:
        if isinstance(message, Outputs):
            for delta in message.deltas:
                if (sink := self.sinks.get(delta.request_id)) is not None:
                    sink(delta)
                else:
                    self.num_unrouted_deltas += 1
        elif isinstance(message, (RequestAccepted, RequestError)):
            if message.request_id is None:
                self.on_unreadable(message.error)
            elif (sink := self.sinks.get(message.request_id)) is not None:
                sink(message)
        elif isinstance(message, EngineStats):
            self.on_stats(message)
        elif isinstance(message, ControlDone):
            if self.on_control is not None:
                self.on_control(message)
            else:
                self.dropped.refuse("an answer to a control call this client never makes")
        elif isinstance(message, EngineStopped):
            self.stop(message.reason, message.failed)

    def stop(self, reason: str, failed: bool = True) -> None:
        """The engine stopped: tell every routed sink once, route no more.
        Logged as an error where it ``failed``; a shutdown it was told to
        make, which ends the live requests too, as a warning."""
        if self.stopped is None:
            if failed:
                logger.error("engine stopped: %s", reason)
            elif self.sinks:
                logger.warning("engine stopped with %d request(s) unfinished: %s",
                               len(self.sinks), reason)
        self.stopped = reason
        for sink in dict.fromkeys(self.sinks.values()):  # a shared sink hears it once
            sink(EngineStopped(reason=reason, failed=failed))
        self.sinks.clear()
        self.on_stopped(reason)
