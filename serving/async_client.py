"""``AsyncEngineClient``: the asyncio face of an engine endpoint client
(the HTTP front end's).

One DEALER socket per front end, in the event loop's thread; sealing,
opening and routing are ``serving.protocol_core``'s, shared with the
blocking ``serving.client.EngineClient``. The loop watches the socket's
file descriptor (``add_reader``) and, each time it signals, reads every
waiting reply at once; the protocol puts each on the queue of the HTTP
request that owns the engine request (several engine requests, the choices
of one HTTP request, may share a queue). The socket is a plain (blocking)
ZeroMQ socket used only with ``NOBLOCK``: a reply reaches its queue in the
callback that saw the descriptor signal, with no future or task between.
Sending never waits (the socket's send queue is unbounded), so an abort can
be sent from a ``finally`` of a cancelled task.

Given ``context`` (the engine server's, with ``endpoint`` its ``inproc://``
address: ``tprun serve`` runs both in one process) the messages pass
between the two threads without ZeroMQ's I/O threads; they are sealed and
opened all the same.

ZeroMQ's descriptor is edge-triggered and any send or receive may consume
its edge, so after each send the client looks at the socket's events again
(``_drain`` soon); otherwise a reply that came meanwhile would wait for the
next one.

Invariants: after ``EngineStopped`` ``dead`` holds the reason, every
waiting queue gets that ``EngineStopped`` item, every waiting ``stats`` or
``control`` raises ``EngineStoppedError``, and so does every later
``submit``, ``stats`` or ``control``. An owner that learns of the
stop beside the socket (``AsyncLLM``, which joins its engine loop's
thread) calls ``stop_after_reading``: the replies sent before the stop
reach their queues first.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import zmq

from ipc import trace
from ipc.engine_messages import (
    AbortRequest,
    ControlDone,
    EngineControl,
    EngineStats,
    GenerateRequest,
    StatsRequest,
)
from ipc.lora_request import LoRARequest
from serving.protocol_core import ClientProtocol, EngineStoppedError, configure_dealer

logger = logging.getLogger(__name__)


class AsyncEngineClient:
    # Replies read per callback before the loop gets a turn (the rest soon after).
    MAX_READS_PER_WAKE = 64
    # Controls awaited with no time limit: the profiler's, as its stop
    # returns once every worker has written its trace, however long a long
    # recording takes to write (a worker's failure still ends the wait).
    UNTIMED_CONTROLS = ("start_profile", "stop_profile")

    def __init__(self, endpoint: str, secret: bytes, stats_timeout_s: float = 10.0,
                 context: zmq.Context | None = None, control_timeout_s: float = 900.0):
        """``context``: a ZeroMQ context to share (an ``inproc://`` endpoint
        must be in it); the client then leaves its termination to its owner.
        ``control_timeout_s``: how long a control call (``control``) may take
        (a sleep copies the weights to the host); the profiler's calls
        (``UNTIMED_CONTROLS``) have no limit."""
        self.endpoint = endpoint
        self.stats_timeout_s = stats_timeout_s
        self.control_timeout_s = control_timeout_s
        self.protocol = ClientProtocol(secret, on_stats=self._stats_arrived,
                                       on_unreadable=self._unreadable,
                                       on_stopped=self._fail_waiters,
                                       on_control=self._control_arrived)
        self.stats_waiters: list[asyncio.Future] = []
        self.control_waiters: list[asyncio.Future] = []  # answered in the order sent
        self.ids = itertools.count()
        self.ctx = context
        self.owns_ctx = context is None
        self.socket: zmq.Socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.fd: int | None = None
        self.drain_scheduled = False

    async def start(self) -> None:
        """Connect and start reading (inside the event loop that serves HTTP)."""
        self.loop = asyncio.get_running_loop()
        if self.ctx is None:
            self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        configure_dealer(self.socket, self.endpoint)
        self.fd = self.socket.getsockopt(zmq.FD)
        self.loop.add_reader(self.fd, self._drain)
        self._drain_soon()

    async def close(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        """``close`` from synchronous code: in the event loop's thread, or
        once the loop has ended."""
        if self.fd is not None:
            self.loop.remove_reader(self.fd)
            self.fd = None
        if self.socket is not None:
            self.socket.close()
            self.socket = None
            if self.owns_ctx:
                self.ctx.term()

    @property
    def dead(self) -> str | None:
        """Why the engine stopped, once it has; else None."""
        return self.protocol.stopped

    # ---- requests --------------------------------------------------------
    def new_id(self) -> str:
        return f"http-{next(self.ids)}"

    def submit(self, request_id: str, prompt_token_ids: list[int] | None, params: dict,
               queue: asyncio.Queue, priority: int = 0, enable_thinking: bool = True,
               cache_salt: str | None = None, prompt: str | None = None,
               pooling_params: dict | None = None,
               lora_request: LoRARequest | None = None) -> None:
        """Send one generate request; its replies go to ``queue``
        (``priority``, ``enable_thinking``, ``cache_salt``,
        ``pooling_params``, which make it an embedding request, and
        ``lora_request``: ``GenerateRequest``'s). The prompt is its token ids, or ``prompt``,
        a text the engine's server tokenizes (``prompt_token_ids`` None)."""
        self.protocol.route(request_id, queue.put_nowait)
        if trace.enabled:
            trace.mark("http_submitted", request_id)
        self._send(GenerateRequest(request_id=request_id, prompt=prompt,
                                   prompt_token_ids=prompt_token_ids,
                                   sampling_params=params, priority=priority,
                                   enable_thinking=enable_thinking, cache_salt=cache_salt,
                                   pooling_params=pooling_params,
                                   lora_request=lora_request))

    def abort(self, request_id: str) -> None:
        """Stop the request in the engine (frees its KV blocks); its later
        replies are dropped. Once the client is closed: nothing to send
        (the engine aborts the requests of a client that is gone)."""
        if self.protocol.unroute(request_id) and self.dead is None and self.socket is not None:
            self._send(AbortRequest(request_id=request_id))

    def stop_request(self, request_id: str) -> None:
        """Ask the engine to end the request and keep its route: its replies
        still come, the last one finished ("abort", unless it finished
        first), so whoever reads them sees it end."""
        if request_id in self.protocol.sinks and self.dead is None and self.socket is not None:
            self._send(AbortRequest(request_id=request_id))

    def forget(self, request_id: str) -> None:
        """The request finished (its last delta arrived)."""
        self.protocol.unroute(request_id)

    async def stats(self) -> EngineStats:
        """The engine's stats; ``EngineStoppedError`` if it does not answer in
        time: ``stats_timeout_s``, or while a control of this client is
        unanswered ``control_timeout_s`` (the engine's loop answers nothing
        while it runs a control: a sleep copying the weights, a stop
        writing traces; a busy engine is not a dead one)."""
        if self.dead is not None:
            raise EngineStoppedError(self.dead)
        waiter = asyncio.get_running_loop().create_future()
        self.stats_waiters.append(waiter)
        self._send(StatsRequest())
        timeout = self.control_timeout_s if self.control_waiters else self.stats_timeout_s
        try:
            return await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            raise EngineStoppedError(f"the engine did not answer within {timeout} s") from None

    async def stats_by_engine(self) -> list[EngineStats]:
        """``[stats()]``: the stats of each engine this client reaches
        (``DataParallelClient``'s face)."""
        return [await self.stats()]

    async def profile(self, start: bool, profile_prefix: str | None = None) -> None:
        """Start or stop the engine's profiler (``control``'s
        "start_profile" / "stop_profile"); returns once the engine has (a
        stop: once every trace is written, however long that takes).
        ``RuntimeError`` with the engine's reason where it refused (no
        ``profiler_config``); ``EngineStoppedError`` once the engine has
        stopped."""
        done = await self.control("start_profile" if start else "stop_profile",
                                  profile_prefix=profile_prefix)
        if done.error is not None:
            raise RuntimeError(done.error)

    # ---- control calls (the profiler, the server's dev routes) -------------
    async def control(self, method: str, level: int = 1, tags: list[str] | None = None,
                      profile_prefix: str | None = None) -> ControlDone:
        """Run an engine control call (``EngineControl``: sleep mode, the
        prefix cache, the profiler) and return its answer, whose ``error``
        is the engine's refusal; ``EngineStoppedError`` if the engine stops
        or does not answer in ``control_timeout_s`` (but the
        ``UNTIMED_CONTROLS``)."""
        if self.dead is not None:
            raise EngineStoppedError(self.dead)
        waiter = asyncio.get_running_loop().create_future()
        self.control_waiters.append(waiter)
        self._send(EngineControl(method=method, level=level, tags=tags,
                                 profile_prefix=profile_prefix))
        timeout = None if method in self.UNTIMED_CONTROLS else self.control_timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            raise EngineStoppedError(
                f"the engine did not answer {method} within {self.control_timeout_s} s") from None

    async def controls_by_engine(self, method: str, level: int = 1,
                                 tags: list[str] | None = None) -> list[ControlDone]:
        """``[control(...)]``: the answer of each engine this client reaches
        (``DataParallelClient``'s face)."""
        return [await self.control(method, level, tags)]

    def _control_arrived(self, done: ControlDone) -> None:
        if self.control_waiters:
            waiter = self.control_waiters.pop(0)
            if not waiter.done():
                waiter.set_result(done)

    # ---- plumbing ----------------------------------------------------------
    def _send(self, message) -> None:
        """Send now (the send queue is unbounded: it never waits), then look
        at the socket's events again soon: the send may have taken the
        descriptor's edge of a reply that is waiting."""
        self.socket.send_multipart(self.protocol.seal(message), zmq.NOBLOCK)
        self._drain_soon()

    def _drain_soon(self) -> None:
        if not self.drain_scheduled:
            self.drain_scheduled = True
            self.loop.call_soon(self._drain)

    def stop_after_reading(self, reason: str, failed: bool = True) -> None:
        """The engine has stopped (its sends are over): route every reply
        it sent before, still waiting in the socket, then tell the waiting
        requests (``ClientProtocol.stop``). So whether a request ended
        before the stop does not depend on when the loop last read: one
        whose last delta the engine sent first ends with it, one it had
        not finished hears the stop. In the event loop's thread, or once
        the loop has ended."""
        self.drain_scheduled = False
        if self.socket is not None and self.fd is not None:
            self._read(limit=None)
        self.protocol.stop(reason, failed)

    def _drain(self) -> None:
        """Read the replies waiting now (at most ``MAX_READS_PER_WAKE``, then
        again soon) and route each."""
        self.drain_scheduled = False
        if self.socket is None or self.fd is None:
            return
        if not self._read(limit=self.MAX_READS_PER_WAKE):
            self._drain_soon()

    def _read(self, limit: int | None) -> bool:
        """Read and route the replies waiting now, at most ``limit`` (None:
        all); whether none is left. A failure here stops the client."""
        try:
            for _ in itertools.count() if limit is None else range(limit):
                if not self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    return True
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
                if trace.enabled:
                    trace.mark("http_delta_received")
                self.protocol.receive(frames)
            return False
        except Exception as e:
            logger.error("the engine client stopped reading", exc_info=e)
            self.loop.remove_reader(self.fd)
            self.fd = None
            self.protocol.stop(f"the engine client failed: {e!r}")
            return True

    def _stats_arrived(self, stats: EngineStats) -> None:
        while self.stats_waiters:
            waiter = self.stats_waiters.pop(0)
            if not waiter.done():
                waiter.set_result(stats)
                break

    @staticmethod
    def _unreadable(error: str) -> None:
        logger.error("the engine could not read a message: %s", error)

    def _fail_waiters(self, reason: str) -> None:
        for waiter in self.stats_waiters + self.control_waiters:
            if not waiter.done():
                waiter.set_exception(EngineStoppedError(reason))
        self.stats_waiters.clear()
        self.control_waiters.clear()
