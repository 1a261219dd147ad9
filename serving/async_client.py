"""``AsyncEngineClient``: the asyncio face of an engine endpoint client
(the HTTP front end's).

One DEALER socket per front end, in the event loop's thread; sealing,
opening and routing are ``serving.protocol_core``'s, shared with the
blocking ``serving.client.EngineClient``. A reader task receives every reply
and the protocol puts it on the queue of the HTTP request that owns the
engine request (several engine requests, the choices of one HTTP request,
may share a queue). Sending never waits (the socket's send queue is
unbounded), so an abort can be sent from a ``finally`` of a cancelled task.

Invariants: after ``EngineStopped`` ``dead`` holds the reason, every
waiting queue gets that ``EngineStopped`` item, and every later ``submit``
or ``stats`` raises ``EngineStoppedError``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import zmq
import zmq.asyncio

from ipc import trace
from ipc.engine_messages import AbortRequest, EngineStats, GenerateRequest, StatsRequest
from serving.protocol_core import ClientProtocol, EngineStoppedError, configure_dealer

logger = logging.getLogger(__name__)


class AsyncEngineClient:
    def __init__(self, endpoint: str, secret: bytes, stats_timeout_s: float = 10.0):
        self.endpoint = endpoint
        self.stats_timeout_s = stats_timeout_s
        self.protocol = ClientProtocol(secret, on_stats=self._stats_arrived,
                                       on_unreadable=self._unreadable,
                                       on_stopped=self._fail_stats_waiters)
        self.stats_waiters: list[asyncio.Future] = []
        self.ids = itertools.count()
        self.ctx: zmq.asyncio.Context | None = None
        self.socket: zmq.asyncio.Socket | None = None
        self.reader: asyncio.Task | None = None

    async def start(self) -> None:
        """Connect and start reading (inside the event loop that serves HTTP)."""
        self.ctx = zmq.asyncio.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        configure_dealer(self.socket, self.endpoint)
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

    @property
    def dead(self) -> str | None:
        """Why the engine stopped, once it has; else None."""
        return self.protocol.stopped

    # ---- requests --------------------------------------------------------
    def new_id(self) -> str:
        return f"http-{next(self.ids)}"

    def submit(self, request_id: str, prompt_token_ids: list[int], params: dict,
               queue: asyncio.Queue) -> None:
        """Send one generate request; its replies go to ``queue``."""
        self.protocol.route(request_id, queue.put_nowait)
        if trace.enabled:
            trace.mark("http_submitted", request_id)
        self._send(GenerateRequest(request_id=request_id, prompt_token_ids=prompt_token_ids,
                                   sampling_params=params))

    def abort(self, request_id: str) -> None:
        """Stop the request in the engine (frees its KV blocks); its later
        replies are dropped."""
        if self.protocol.unroute(request_id) and self.dead is None:
            self._send(AbortRequest(request_id=request_id))

    def forget(self, request_id: str) -> None:
        """The request finished (its last delta arrived)."""
        self.protocol.unroute(request_id)

    async def stats(self) -> EngineStats:
        """The engine's stats; ``EngineStoppedError`` if it does not answer in time."""
        if self.dead is not None:
            raise EngineStoppedError(self.dead)
        waiter = asyncio.get_running_loop().create_future()
        self.stats_waiters.append(waiter)
        self._send(StatsRequest())
        try:
            return await asyncio.wait_for(waiter, self.stats_timeout_s)
        except asyncio.TimeoutError:
            raise EngineStoppedError(
                f"the engine did not answer within {self.stats_timeout_s} s") from None

    # ---- plumbing ----------------------------------------------------------
    def _send(self, message) -> None:
        """Send now, without awaiting: with an unbounded send queue the
        socket sends at once and returns a finished future (a send on a
        shadow socket would instead hide the socket's readiness from the
        reader, whose wake-ups the asyncio socket manages)."""
        self.socket.send_multipart(self.protocol.seal(message))

    def _reader_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("the engine client stopped reading", exc_info=task.exception())
            self.protocol.stop(f"the engine client failed: {task.exception()!r}")

    async def _read(self) -> None:
        while True:
            frames = await self.socket.recv_multipart()
            if trace.enabled:
                trace.mark("http_delta_received")
            self.protocol.receive(frames)

    def _stats_arrived(self, stats: EngineStats) -> None:
        while self.stats_waiters:
            waiter = self.stats_waiters.pop(0)
            if not waiter.done():
                waiter.set_result(stats)
                break

    @staticmethod
    def _unreadable(error: str) -> None:
        logger.error("the engine could not read a message: %s", error)

    def _fail_stats_waiters(self, reason: str) -> None:
        for waiter in self.stats_waiters:
            if not waiter.done():
                waiter.set_exception(EngineStoppedError(reason))
        self.stats_waiters.clear()
