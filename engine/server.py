"""The serving loop: one ``LLMEngine`` behind a ZeroMQ ROUTER socket.

Clients (``engine.client.EngineClient``) connect DEALER sockets and speak
``ipc.engine_messages``. The loop alternates between reading every waiting
client message (without blocking while the engine has work) and one engine
step, whose deltas go back to the client that owns each request. The engine
runs in this thread only.

Invariants: each client's requests are answered to that client only (the
ROUTER routes by the client's identity); a request gets exactly one last
delta (finished, with its reason) unless it was refused, in which case it
gets one ``RequestError`` and nothing was scheduled, or the engine stopped
first, in which case its client gets ``EngineStopped``; an invalid or
malformed message never stops the loop. Request ids are per client; the
engine sees ids of its own. A client that is gone (the ROUTER cannot route
to it) has its requests aborted.

The endpoint is ``ipc://`` in a fresh directory only the owner can enter
(the socket file is 0600), or ``tcp://127.0.0.1:PORT``.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field

import msgspec
import zmq

from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutputDelta
from engine.sampling_params import SamplingParams
from engine.tokenizer import IncrementalDetokenizer
from ipc.engine_messages import (
    AbortRequest,
    Delta,
    EngineStopped,
    GenerateRequest,
    Outputs,
    RequestAccepted,
    RequestError,
    StatsRequest,
    decode_client_message,
    encode,
    request_id_of,
)

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_IDLE_POLL_MS = 100


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens; ``directory`` (ipc only) is removed by ``cleanup``."""

    address: str
    directory: str | None = None

    @classmethod
    def create(cls, port: int | None = None) -> Endpoint:
        """``tcp://127.0.0.1:PORT`` (port 0: any free port, resolved at bind),
        or an ipc:// socket in a new mode-0700 directory."""
        if port is not None:
            if not 0 <= port < 65536:
                raise ValueError(f"--port must be in [0, 65535], got {port}")
            return cls(f"tcp://127.0.0.1:{port or '*'}")
        directory = tempfile.mkdtemp(prefix="tprun-serve-")
        os.chmod(directory, 0o700)
        return cls(f"ipc://{directory}/engine", directory)

    def cleanup(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def write_endpoint_file(path: str, address: str) -> None:
    """Write ``address`` to ``path`` atomically (a reader never sees half),
    readable by the owner only."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(address + "\n")
    os.replace(tmp, path)


@dataclass
class _Route:
    """Where an engine request's deltas go, and its text so far."""

    identity: bytes
    request_id: str
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)


class EngineServer:
    """Binds ``endpoint`` (and writes its address to ``endpoint_file``);
    ``close()`` removes both. ``address`` is the bound address (the real
    port when ``Endpoint.create(0)`` asked for any)."""

    def __init__(self, engine: LLMEngine, endpoint: Endpoint, endpoint_file: str | None = None):
        self.engine = engine
        self.endpoint = endpoint
        self.endpoint_file = endpoint_file
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unroutable: raise, don't drop
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.socket.setsockopt(zmq.LINGER, 0)
        try:
            self.socket.bind(endpoint.address)
            self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
            if self.address.startswith("ipc://"):
                os.chmod(self.address[len("ipc://"):], 0o600)
            if endpoint_file:
                write_endpoint_file(endpoint_file, self.address)
        except BaseException:
            self.close()
            raise
        self.routes: dict[str, _Route] = {}  # engine request id -> its client
        self.engine_ids: dict[tuple[bytes, str], str] = {}  # (client, its id) -> engine id
        self.next_id = itertools.count()
        self.stopping = False

    # ---- the loop --------------------------------------------------------
    def serve(self) -> None:
        """Run until ``stop()``; an exception of the engine (a dead worker)
        ends it too. Either way, clients with live requests are told."""
        try:
            while not self.stopping:
                busy = self.engine.has_unfinished_requests()
                self._receive(timeout_ms=0 if busy else _IDLE_POLL_MS)
                if self.engine.has_unfinished_requests():
                    self._send_deltas(self.engine.step())
                else:
                    self.engine.maybe_log_stats()
        except BaseException as e:
            self._announce_stop(f"the engine failed: {e}")
            raise
        self._announce_stop("the engine is shutting down")

    def stop(self) -> None:
        """Ask the loop to end after its current turn (signal-handler safe)."""
        self.stopping = True

    def close(self) -> None:
        """Close the socket; remove the endpoint's directory and file."""
        self.socket.close()
        self.ctx.term()
        self.endpoint.cleanup()
        if self.endpoint_file:
            try:
                os.remove(self.endpoint_file)
            except FileNotFoundError:
                pass

    # ---- client messages ---------------------------------------------------
    def _receive(self, timeout_ms: int) -> None:
        if not self.socket.poll(timeout_ms):
            return
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, data = frames[0], frames[-1]
            if len(frames) != 2:
                self._reply(identity, RequestError(request_id=None, error=(
                    f"expected one message frame, got {len(frames) - 1}")))
                continue
            self._handle(identity, data)

    def _handle(self, identity: bytes, data: bytes) -> None:
        try:
            message = decode_client_message(data)
        except ValueError as e:
            self._reply(identity, RequestError(request_id=request_id_of(data), error=str(e)))
            return
        if isinstance(message, GenerateRequest):
            self._add(identity, message)
        elif isinstance(message, AbortRequest):
            engine_id = self.engine_ids.get((identity, message.request_id))
            if engine_id is not None:
                self._send_deltas(self.engine.abort([engine_id]))
        elif isinstance(message, StatsRequest):
            self._reply(identity, self.engine.get_stats())

    def _add(self, identity: bytes, message: GenerateRequest) -> None:
        key = (identity, message.request_id)
        try:
            if key in self.engine_ids:
                raise ValueError(f"request id {message.request_id!r} is already in use "
                                 f"by one of this client's live requests")
            prompt = _prompt(message)
            params = SamplingParams.from_dict(message.sampling_params)
            engine_id = str(next(self.next_id))
            request = self.engine.add_request(prompt, params, req_id=engine_id)
        except Exception as e:
            if not isinstance(e, (ValueError, TypeError)):
                logger.exception("request %r refused", message.request_id)
            error = str(e) or type(e).__name__
            self._reply(identity, RequestError(request_id=message.request_id, error=error))
            return
        detokenizer = IncrementalDetokenizer(self.engine.tokenizer, request.prompt_token_ids)
        self.routes[engine_id] = _Route(identity, message.request_id, detokenizer)
        self.engine_ids[key] = engine_id
        self._reply(identity, RequestAccepted(request_id=message.request_id,
                                              prompt_token_ids=request.prompt_token_ids))

    # ---- replies -----------------------------------------------------------
    def _send_deltas(self, deltas: list[RequestOutputDelta]) -> None:
        """One ``Outputs`` message per client with news in this step."""
        by_client: dict[bytes, list[Delta]] = defaultdict(list)
        for d in deltas:
            route = self.routes.get(d.req_id)
            if route is None:
                continue
            by_client[route.identity].append(self._delta(route, d))
            if d.finished:
                self._forget(d.req_id)
        for identity, items in by_client.items():
            self._reply(identity, Outputs(deltas=items))

    def _delta(self, route: _Route, d: RequestOutputDelta) -> Delta:
        route.token_ids += d.new_token_ids
        text = route.detokenizer.feed(d.new_token_ids)
        if d.finished:  # release what the detokenizer held back (an incomplete character)
            sent = route.detokenizer.output_text
            full = self.engine.tokenizer.decode(route.token_ids)
            text += full[len(sent):] if full.startswith(sent) else ""
        return Delta(request_id=route.request_id, token_ids=list(d.new_token_ids), text=text,
                     finished=d.finished, finish_reason=d.finish_reason)

    def _forget(self, engine_id: str) -> None:
        route = self.routes.pop(engine_id)
        del self.engine_ids[(route.identity, route.request_id)]

    def _reply(self, identity: bytes, message: msgspec.Struct) -> None:
        try:
            self.socket.send_multipart([identity, encode(message)])
        except zmq.ZMQError as e:
            if e.errno != errno.EHOSTUNREACH:
                raise
            self._drop_client(identity)

    def _announce_stop(self, reason: str) -> None:
        for identity in {route.identity for route in self.routes.values()}:
            self._reply(identity, EngineStopped(reason=reason))
        self.routes.clear()
        self.engine_ids.clear()

    def _drop_client(self, identity: bytes) -> None:
        gone = [eid for eid, route in self.routes.items() if route.identity == identity]
        if gone:
            logger.warning("a client is gone; aborting its %d request(s)", len(gone))
        self.engine.abort(gone)
        for engine_id in gone:
            self._forget(engine_id)


def _prompt(message: GenerateRequest) -> str | dict:
    if (message.prompt is None) == (message.prompt_token_ids is None):
        raise ValueError("give exactly one of prompt (text) and prompt_token_ids")
    if message.prompt is not None:
        return message.prompt
    return {"prompt_token_ids": message.prompt_token_ids}
