"""``EngineLink``: the HTTP front end's asyncio client of the engine endpoint.

One DEALER socket per front end, in the event loop's thread, speaking
``ipc.engine_messages`` sealed with the launch's secret, like
``serving.client.EngineClient``. A reader task opens every reply and puts it
on the queue of the HTTP request that owns the engine request (several
engine requests, the choices of one HTTP request, may share a queue).
Sending never waits (the socket's send queue is unbounded), so an abort can
be sent from a ``finally`` of a cancelled task.

Invariants: after ``EngineStopped`` ``dead`` holds
the reason, every waiting queue gets an ``EngineDead`` item, and every
later ``submit`` raises ``EngineDeadError``. A reply without a valid MAC is
dropped and counted, never decoded.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass

import zmq
import zmq.asyncio

from ipc.auth import Authenticator, AuthError, RefusalLog
from ipc.engine_messages import (
    MAX_MESSAGE_BYTES,
    AbortRequest,
    EngineStats,
    EngineStopped,
    GenerateRequest,
    Outputs,
    RequestAccepted,
    RequestError,
    StatsRequest,
    decode_server_message,
    encode,
)

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine stopped or does not answer; HTTP 503."""

    def client_message(self) -> str:
        """What a client is told: the first line of the reason (a worker's
        traceback stays in the engine's log)."""
        reason = str(self).splitlines()[0] if str(self) else "no reason given"
        return f"the engine stopped: {reason}"


@dataclass(frozen=True)
class EngineDead:
    """Queue item: the engine stopped before this request finished."""

    reason: str


class EngineLink:
    def __init__(self, endpoint: str, secret: bytes, stats_timeout_s: float = 10.0):
        self.endpoint = endpoint
        self.auth = Authenticator.for_client(secret)
        self.stats_timeout_s = stats_timeout_s
        self.dropped = RefusalLog(logger, "a reply from the engine")
        self.dead: str | None = None
        self.queues: dict[str, asyncio.Queue] = {}  # engine-side request id -> its queue
        self.stats_waiters: list[asyncio.Future] = []
        self.ids = itertools.count()
        self.ctx: zmq.asyncio.Context | None = None
        self.socket: zmq.asyncio.Socket | None = None
        self.reader: asyncio.Task | None = None

    async def start(self) -> None:
        """Connect and start reading (inside the event loop that serves HTTP)."""
        self.ctx = zmq.asyncio.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0),
                              (zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)):
            self.socket.setsockopt(option, value)
        self.socket.connect(self.endpoint)
        self.reader = asyncio.create_task(self._read())
        self.reader.add_done_callback(self._reader_ended)

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            try:
                await self.reader
            except asyncio.CancelledError:
                pass
        if self.socket is not None:
            self.socket.close()
            self.ctx.term()

    # ---- requests --------------------------------------------------------
    def new_id(self) -> str:
        return f"http-{next(self.ids)}"

    def submit(self, request_id: str, prompt_token_ids: list[int], params: dict,
               queue: asyncio.Queue) -> None:
        """Send one generate request; its replies go to ``queue``."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        self.queues[request_id] = queue
        self._send(GenerateRequest(request_id=request_id, prompt_token_ids=prompt_token_ids,
                                   sampling_params=params))

    def abort(self, request_id: str) -> None:
        """Stop the request in the engine (frees its KV blocks); its later
        replies are dropped."""
        if self.queues.pop(request_id, None) is not None and self.dead is None:
            self._send(AbortRequest(request_id=request_id))

    def forget(self, request_id: str) -> None:
        """The request finished (its last delta arrived)."""
        self.queues.pop(request_id, None)

    async def stats(self) -> EngineStats:
        """The engine's stats; ``EngineDeadError`` if it does not answer in time."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        waiter = asyncio.get_running_loop().create_future()
        self.stats_waiters.append(waiter)
        self._send(StatsRequest())
        try:
            return await asyncio.wait_for(waiter, self.stats_timeout_s)
        except asyncio.TimeoutError:
            raise EngineDeadError(
                f"the engine did not answer within {self.stats_timeout_s} s") from None

    # ---- plumbing ----------------------------------------------------------
    def _send(self, message) -> None:
        """Send now, without awaiting: with an unbounded send queue the
        socket sends at once and returns a finished future (a send on a
        shadow socket would instead hide the socket's readiness from the
        reader, whose wake-ups the asyncio socket manages)."""
        self.socket.send_multipart(self.auth.seal(encode(message)))

    def _reader_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("the engine link stopped reading", exc_info=task.exception())
            self._die(f"the engine link failed: {task.exception()!r}")

    async def _read(self) -> None:
        while True:
            frames = await self.socket.recv_multipart()
            try:
                message = decode_server_message(self.auth.unseal(frames))
            except AuthError as e:
                self.dropped.refuse(str(e))
                continue
            except ValueError as e:
                self.dropped.refuse(f"a valid MAC, but {e}")
                continue
            self._dispatch(message)

    def _dispatch(self, message) -> None:
        if isinstance(message, Outputs):
            for delta in message.deltas:
                if (queue := self.queues.get(delta.request_id)) is not None:
                    queue.put_nowait(delta)
        elif isinstance(message, (RequestAccepted, RequestError)):
            if message.request_id is None:
                logger.error("the engine could not read a message: %s", message.error)
            elif (queue := self.queues.get(message.request_id)) is not None:
                queue.put_nowait(message)
        elif isinstance(message, EngineStats):
            while self.stats_waiters:
                waiter = self.stats_waiters.pop(0)
                if not waiter.done():
                    waiter.set_result(message)
                    break
        elif isinstance(message, EngineStopped):
            self._die(message.reason)

    def _die(self, reason: str) -> None:
        if self.dead is None:
            logger.error("engine stopped: %s", reason)
        self.dead = reason
        for queue in {id(q): q for q in self.queues.values()}.values():
            queue.put_nowait(EngineDead(reason))
        self.queues.clear()
        for waiter in self.stats_waiters:
            if not waiter.done():
                waiter.set_exception(EngineDeadError(reason))
        self.stats_waiters.clear()
