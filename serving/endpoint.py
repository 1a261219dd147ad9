"""The serving loop: one ``LLMEngine`` behind a ZeroMQ ROUTER socket.

Clients (``serving.client.EngineClient``) connect DEALER sockets and speak
``ipc.engine_messages``, each message sealed with the launch's secret
(``ipc.auth``: frames ``[mac, payload]``, HMAC-SHA256). The loop alternates
between reading every waiting client message (without blocking while the
engine has work) and one engine step, whose deltas go back to the client
that owns each request. The engine's state changes in this thread only
(the tokenizer threads below make requests, which changes none). An
``EngineControl`` runs in this thread too (``_control``): the loop waits
while the workers sleep or wake, start their profilers, or write their
traces.

Invariants: a message without a valid MAC is never decoded and never
answered: it is dropped, counted (``EngineStats.num_refused_messages``) and
logged (throttled). Each client's requests are answered to that client only
(the ROUTER routes by the client's identity); a request gets exactly one
last delta (finished, with its reason) unless it was refused, in which case
it gets one ``RequestError`` and nothing was scheduled, or the engine
stopped first, in which case its client gets ``EngineStopped``; an invalid,
malformed or unauthenticated message never stops the loop. A refusal says
whether the request asks for what cannot be served (an
``InvalidRequestError``: ``RequestError.invalid_request``, which a front end
passes on as its client's error) or was refused for another reason: a
message the protocol does not allow (``ProtocolError``, logged on one line)
or the engine's own failure to make it (logged with its traceback). A request's
``RequestAccepted`` is held until the plan of the next step is sent (the
client's work on it then overlaps the workers', not the scheduling); it
still precedes the request's deltas, and a refusal made while one is held
waits behind it, so a client's request replies keep its messages' order
(but for a request that waits, below: it is answered once ready). Request
ids are per client; the engine sees ids of its own. A client that is gone
(the ROUTER cannot route to it) has its requests aborted, and those still
waiting dropped.

Admission never runs a tokenizer or waits for a compile on the loop's
thread. A request waits, unscheduled, while its structured-output grammar
compiles in the engine's compile threads, then while its text (a text
prompt, ``bad_words``) is tokenized in this server's tokenizer threads
(``LLMEngine.new_request`` there); the loop goes on serving the others
meanwhile, and a tokenizer thread that ends wakes it. The request is then
admitted or refused (a grammar that does not compile in time, a prompt too
long), so a bad constraint or prompt is a ``RequestError`` like any invalid
request. The engine's stats count a waiting request as waiting, once:
the server gives the engine the size of its map for each snapshot and
stats line (``LLMEngine.get_stats``, ``step``, ``maybe_log_stats``), and a
request leaves the map as it is queued in the engine. A waiting request does not hold back the client's later requests
(the HTTP front end is one client for all its users: one user's slow schema
must not stall the others); a later message with its request id is answered
after it. An abort of a waiting request ends it at once (a last delta,
"abort"): it is never admitted. A stop tells the clients of waiting
requests too (``EngineStopped``). ``close`` waits for a tokenizer thread
still running (a tokenizer cannot be interrupted), so no thread outlives
the server. A frame above
``MAX_MESSAGE_BYTES`` makes ZeroMQ cut that connection before the server
sees it; the cut is logged (INFO) like any closed connection.

The socket also binds ``inproc_address`` in its ZeroMQ context ``ctx``,
for a client in this process (``tprun serve``'s HTTP front end): no other
process can reach it, and its messages are sealed and checked like any.

The endpoint is ``ipc://DIR/engine`` in a fresh directory only the owner can
enter (the socket file is 0600), or ``tcp://127.0.0.1:PORT``, or, only when
asked for by name, ``tcp://HOST:PORT``. The secret is written (hex, mode
0600) to ``DIR/engine.key`` (a private directory is made for tcp:// too)
and, given an endpoint file ``F``, to ``F.key``; ``close`` removes them all.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import itertools
import logging
import os
import re
import shutil
import socket
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from checkpoint.tokenizer import IncrementalDetokenizer
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutputDelta, shown_token_ids
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams
from executor.base import StepRejected
from ipc import serde, trace
from ipc.auth import (
    Authenticator,
    AuthError,
    RefusalLog,
    new_secret,
    sibling_key_file,
    write_key_file,
)
from ipc.endpoints import bind_error, private_directory
from ipc.engine_messages import (
    ENGINE_CONTROLS,
    AbortRequest,
    ControlDone,
    Delta,
    EngineControl,
    EngineStopped,
    GenerateRequest,
    Outputs,
    RequestAccepted,
    RequestError,
    StatsRequest,
    TokenLogprob,
    decode_client_message,
    request_id_of,
)
from ipc.errors import InvalidRequestError
from ipc.serde import MAX_MESSAGE_BYTES, encode

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
_IDLE_POLL_MS = 100
_COMPILE_POLL_MS = 2  # while a grammar compiles: look again soon
# Texts tokenized at once: a very long one leaves a thread for the others'.
_TOKENIZER_THREADS = 2


def is_loopback(host: str) -> bool:
    """True for loopback addresses (127.0.0.0/8, ::1) and "localhost"."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
        return True
    except ValueError:
        return host == "*" or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", host) is not None


def check_listen_address(host: str, port: int, port_flag: str) -> None:
    """``ValueError`` unless a TCP server can listen on ``host:port`` now:
    ``host`` resolves, to an address of this machine, and ``port`` (0: any)
    is free on it. Run before the model loads, so a host or port that
    cannot work is the user's input error, not a failure minutes later; the
    server binds again once the engine is ready. ``port_flag`` names the
    option the port came from. ZeroMQ's own host forms (``*``, an interface
    name) are taken as it takes them: every interface, that interface."""
    if host in {name for _, name in socket.if_nameindex()}:
        return
    name = "0.0.0.0" if host == "*" else host.strip("[]")
    try:
        addresses = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"--host {host} does not resolve ({e.strerror or e})") from None
    error = bind_error(addresses)
    if error is None:
        return
    if error.errno == errno.EADDRINUSE:
        raise ValueError(f"{port_flag} {port}: cannot listen on {host}:{port} "
                         f"({error.strerror}); is another server using it?")
    raise ValueError(f"--host {host} is not an address of this machine ({error.strerror}); "
                     f"the default, {DEFAULT_HOST}, serves this machine only")


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens, and its private directory (mode 0700),
    which holds the key file (and, for ipc://, the socket); ``cleanup``
    removes the directory."""

    address: str
    directory: str

    @classmethod
    def create(cls, port: int | None = None, host: str | None = None) -> Endpoint:
        """An ipc:// socket in a new private directory; or, given ``port``
        or ``host``, ``tcp://HOST:PORT`` (host 127.0.0.1 unless named; port 0
        or none: any free port, resolved at bind)."""
        if port is not None and not 0 <= port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {port}")
        if host is not None and not _valid_host(host):
            raise ValueError(f"--host must be an IP address, '*', or an interface or host "
                             f"name, got {host!r}")
        ipc = port is None and host is None
        directory = private_directory("serve-", sockets=("engine",) if ipc else ())
        os.chmod(directory, 0o700)
        if ipc:
            return cls(f"ipc://{directory}/engine", directory)
        host = host or DEFAULT_HOST
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 address
        return cls(f"tcp://{host}:{port or '*'}", directory)

    @property
    def host(self) -> str | None:
        """The tcp:// host (None for ipc://)."""
        if not self.address.startswith("tcp://"):
            return None
        return self.address[len("tcp://"):].rsplit(":", 1)[0]

    @property
    def key_file(self) -> str:
        return sibling_key_file(os.path.join(self.directory, "engine"))

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def exposure_warning(endpoint: Endpoint) -> str | None:
    """The warning to give when ``endpoint`` listens beyond this host's loopback."""
    host = endpoint.host
    if host is None or is_loopback(host):
        return None
    return (f"the engine endpoint listens on {host}, not a loopback address: any host that can "
            f"reach it may connect. Messages are authenticated (HMAC with the key in "
            f"the key file) but not encrypted; prompts and outputs cross the network "
            f"in the clear.")


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
    detokenizer: IncrementalDetokenizer | None  # None: detokenize=False, no text


@dataclass
class _Waiting:
    """A request received, neither admitted nor refused yet. ``request``:
    its engine ``Request`` being made (``LLMEngine.new_request``; its error,
    a refusal), None while its grammar compiles. ``then``: the replies to
    the client's later messages with the same request id, sent after this
    request's own."""

    identity: bytes
    message: GenerateRequest
    prompt: str | dict
    params: SamplingParams
    engine_id: str
    request: Future | None = None
    pooling: PoolingParams | None = None  # an embedding request's
    then: list[msgspec.Struct] = field(default_factory=list)


class EngineServer:
    """Binds ``endpoint``, writes the key files, then the endpoint file
    (so a client that sees the endpoint file finds its key); ``close()``
    removes them all. ``address`` is the bound address (the real port when
    any port was asked for); ``key_file`` the key file to tell users about.
    ``secret`` defaults to a new random one."""

    def __init__(self, engine: LLMEngine, endpoint: Endpoint, endpoint_file: str | None = None,
                 secret: bytes | None = None):
        self.engine = engine
        self.endpoint = endpoint
        self.endpoint_file = endpoint_file
        secret = new_secret() if secret is None else secret
        self.auth = Authenticator.for_server(secret)
        self.refusals = RefusalLog(logger, "a client message")
        self.key_files = [endpoint.key_file]
        if endpoint_file:
            self.key_files.append(sibling_key_file(endpoint_file))
        self.key_file = self.key_files[-1]
        self.ctx = zmq.Context()
        # In-process clients (the HTTP front end of ``tprun serve``): the
        # same socket, reached within ``ctx`` without ZeroMQ's I/O threads.
        self.inproc_address = f"inproc://tprun-engine-{os.getpid()}-{id(self):x}"
        self.socket = self.ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unroutable: raise, don't drop
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.socket.setsockopt(zmq.LINGER, 0)
        if endpoint.address.startswith("tcp://["):
            self.socket.setsockopt(zmq.IPV6, 1)  # IPv6 hosts only: IPv4 would read ::ffff:
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        # Tokenizer threads (made when first needed); the one that ends wakes the loop's poll.
        self.tokenizers = ThreadPoolExecutor(_TOKENIZER_THREADS, thread_name_prefix="tokenize")
        self.wake_reader, self.waker = socket.socketpair()
        for end in (self.wake_reader, self.waker):
            end.setblocking(False)
        self.poller.register(self.wake_reader, zmq.POLLIN)
        try:
            try:
                self.socket.bind(endpoint.address)
            except zmq.ZMQError as e:
                raise OSError(f"cannot listen on {endpoint.address}: {e}") from None
            self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
            self.socket.bind(self.inproc_address)
            if self.address.startswith("ipc://"):
                os.chmod(self.address[len("ipc://"):], 0o600)
            for path in self.key_files:
                write_key_file(path, secret)
            if endpoint_file:
                write_endpoint_file(endpoint_file, self.address)
        except BaseException:
            self.close()
            raise
        self.routes: dict[str, _Route] = {}  # engine request id -> its client
        # (client, its id) -> a request not admitted yet, in the order they came.
        # Counted as waiting in the engine's stats from arrival, not admission.
        self.waiting: dict[tuple[bytes, str], _Waiting] = {}
        self.engine_ids: dict[tuple[bytes, str], str] = {}  # (client, its id) -> engine id
        # Replies held back: acceptances, which go once the step after the
        # request's admission is on its way (``_flush_accepts``), before any
        # delta, and any refusal made after one (replies keep their order).
        self.accepts: list[tuple[bytes, msgspec.Struct]] = []
        self.next_id = itertools.count()
        self.stopping = False
        # The client whose EngineControl the loop is running (None: none):
        # told too if the engine fails during the call (``_announce_stop``).
        self.controlling: bytes | None = None

    # ---- the loop --------------------------------------------------------
    def serve(self) -> None:
        """Run until ``stop()``; an exception of the engine (a dead worker)
        ends it too. Either way, clients with live requests are told."""
        try:
            while not self.stopping:
                # Asleep (sleep mode), queued requests wait for wake_up.
                busy = self.engine.has_unfinished_requests() and not self.engine.is_sleeping()
                compiling = any(w.request is None for w in self.waiting.values())
                self._receive(timeout_ms=0 if busy else
                              _COMPILE_POLL_MS if compiling else _IDLE_POLL_MS)
                for key in list(self.waiting):
                    self._advance(key)
                if self.engine.has_unfinished_requests() and not self.engine.is_sleeping():
                    self._send_deltas(self.engine.step(after_send=self._flush_accepts,
                                                       num_admitting=len(self.waiting)))
                else:
                    self._flush_accepts()
                    self.engine.check_health()  # a worker that died while idle ends it too
                    self.engine.maybe_log_stats(len(self.waiting))
        except BaseException as e:
            self._announce_stop(f"the engine failed: {e}")
            raise
        finally:
            self._end_profile()
        self._announce_stop("the engine is shutting down", failed=False)

    def _end_profile(self) -> None:
        """Write a trace still recording, on the loop's thread: the thread
        that started the profiler must stop it (an in-process worker's
        profiler stopped by the thread that shuts the engine down crashes
        the process in the profiler's library)."""
        if not self.engine.profiling:
            return
        try:
            self.engine.stop_profile()
        except Exception as e:  # a dead worker: the stop matters more than the trace
            logger.warning("the profiler's trace was not written at shutdown: %s", e)

    def stop(self) -> None:
        """Ask the loop to end after its current turn (signal-handler safe)."""
        self.stopping = True

    def close(self, term_context: bool = True) -> None:
        """End the tokenizer threads (after the text one may be tokenizing);
        close the sockets; remove the endpoint's directory, the endpoint
        file and the key files. ``term_context`` False: leave the ZeroMQ
        context alone (an in-process client that did not stop still holds
        a socket of it, and terminating it would wait for that socket)."""
        self.tokenizers.shutdown(wait=True, cancel_futures=True)
        self.wake_reader.close()
        self.waker.close()
        self.socket.disable_monitor()
        self.monitor.close()
        self.socket.close()
        if term_context:
            self.ctx.term()
        self.endpoint.cleanup()
        for path in [self.endpoint_file, *self.key_files]:
            if path:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass

    # ---- client messages ---------------------------------------------------
    def _receive(self, timeout_ms: int) -> None:
        ready = dict(self.poller.poll(timeout_ms))
        if self.monitor in ready:
            self._log_disconnects()
        if self.wake_reader.fileno() in ready:
            self._clear_wakes()
        if self.socket not in ready:
            return
        while True:
            try:
                identity, *frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                data = self.auth.unseal(frames)
            except AuthError as e:
                self.refusals.refuse(str(e))
                continue
            self._handle(identity, data)

    def _log_disconnects(self) -> None:
        while self.monitor.poll(0):
            recv_monitor_message(self.monitor)
            logger.info("a client connection closed (closed by the client, or cut by ZeroMQ "
                        "for a frame over %d bytes)", MAX_MESSAGE_BYTES)

    def _wake(self, _done: Future) -> None:
        """Wake the loop's poll (a tokenizer thread has ended); a full or
        closed socket needs nothing more."""
        try:
            self.waker.send(b"\0")
        except OSError:
            pass

    def _clear_wakes(self) -> None:
        try:
            while self.wake_reader.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _handle(self, identity: bytes, data: bytes) -> None:
        try:
            message = decode_client_message(data)
        except ValueError as e:
            logger.warning("%s (from an authenticated client; answered)", e)
            self._reply(identity, RequestError(request_id=request_id_of(data), error=str(e)))
            return
        if isinstance(message, GenerateRequest):
            if trace.enabled:
                trace.mark("engine_received", message.request_id)
            self._add(identity, message)
        elif isinstance(message, AbortRequest):
            self._abort(identity, message.request_id)
        elif isinstance(message, EngineControl):
            self.controlling = identity
            self._reply(identity, self._control(message))
            self.controlling = None
        elif isinstance(message, StatsRequest):
            self._reply(identity, msgspec.structs.replace(
                self.engine.get_stats(len(self.waiting), [
                    w.message.lora_request for w in self.waiting.values()]),
                num_refused_messages=self.refusals.count))

    def _control(self, message: EngineControl) -> ControlDone:
        """Run a control call on the engine (sleep mode, the prefix cache,
        the profiler: ``_profile``); the requests a sleep aborts get their
        last deltas first, before the workers are asked. A call the engine
        refuses (sleep mode off, a bad level or tag) is answered with its
        reason. A call that fails on workers that still serve (a wake_up
        out of device memory) is answered with the failure, the engine
        serving on as vLLM's does after a failed utility call; a worker's
        death, or a step's failure met on the way, ends the loop as a
        step's does."""
        engine, method = self.engine, message.method
        if method in ("start_profile", "stop_profile"):
            return self._profile(method, message.profile_prefix)
        try:
            if method == "sleep":
                engine.check_sleep(message.level)
            elif method == "wake_up":
                engine.check_wake_up(message.tags)
            elif method not in ("is_sleeping", "reset_prefix_cache"):
                raise ValueError(f"unknown engine control {method!r}; the controls are "
                                 f"{list(ENGINE_CONTROLS)}")
        except (AssertionError, ValueError) as e:
            return ControlDone(method=method, value=engine.is_sleeping(), error=str(e))
        try:
            if method == "sleep":
                if not engine.is_sleeping():  # sleep's own abort, sent whatever the workers do
                    self._send_deltas(engine.abort(list(engine.scheduler.requests)))
                self._send_deltas(engine.sleep(message.level))
            elif method == "wake_up":
                engine.wake_up(message.tags)
            elif method == "reset_prefix_cache":
                return ControlDone(method=method, value=engine.reset_prefix_cache())
        except Exception as e:
            engine.check_health()  # a dead worker, a broken reply: the loop ends
            if isinstance(e, StepRejected):
                raise
            logger.warning("engine control %s failed: %s", method, e)
            return ControlDone(method=method, value=engine.is_sleeping(),
                               error=str(e) or type(e).__name__)
        return ControlDone(method=method, value=engine.is_sleeping())

    def _profile(self, method: str, profile_prefix: str | None) -> ControlDone:
        """Start or stop the workers' profilers, in this thread (the steps
        already sent run first; the loop waits for the workers' answers,
        a stop for the traces written). A refusal (no ``profiler_config``)
        or a call that failed on a worker that still serves (a trace
        directory it cannot make) is the answer's error; a worker that has
        died ends the loop, as a failed step does (``check_health``)."""
        try:
            if method == "start_profile":
                self.engine.start_profile(profile_prefix)
            else:
                self.engine.stop_profile()
        except Exception as e:
            self.engine.check_health()
            logger.warning("%s the profiler failed: %s",
                           "starting" if method == "start_profile" else "stopping", e)
            return ControlDone(method=method, error=str(e) or type(e).__name__)
        return ControlDone(method=method)

    def _add(self, identity: bytes, message: GenerateRequest) -> None:
        key = (identity, message.request_id)
        try:
            if key in self.engine_ids or key in self.waiting:
                raise ProtocolError(f"request id {message.request_id!r} is already in use "
                                    f"by one of this client's live requests")
            prompt = _prompt(message)
            pooling = None
            if message.pooling_params is not None:
                pooling = PoolingParams.from_dict(message.pooling_params)
                params = SamplingParams(detokenize=False)  # no text, no grammar
            else:
                params = SamplingParams.from_dict(message.sampling_params)
            if params.n != 1 or params.stop:
                raise ProtocolError("an engine request takes n 1 and no stop strings: the "
                                    "caller runs n requests and cuts their text (as LLM and "
                                    "the HTTP server do)")
        except Exception as e:
            self._refuse(identity, message, e)
            return
        self.waiting[key] = _Waiting(identity, message, prompt, params, str(next(self.next_id)),
                                     pooling=pooling)
        self._advance(key)

    def _advance(self, key: tuple[bytes, str]) -> None:
        """Take a waiting request as far as it goes now: once its grammar
        is ready (``ready`` starts the compile), make its engine request;
        once made, admit it, or refuse it. A key no longer waiting (its
        client went while the loop admitted another) is passed over."""
        waiting = self.waiting.get(key)
        if waiting is None:
            return
        if waiting.request is None:
            if not self.engine.structured_outputs.ready(waiting.params):
                return
            waiting.request = self._make_request(waiting)
        if waiting.request.done():
            del self.waiting[key]
            self._admit(waiting)

    def _make_request(self, waiting: _Waiting) -> Future:
        """``LLMEngine.new_request`` for ``waiting``: in a tokenizer thread
        when it has text to tokenize (a text prompt, ``bad_words``); here,
        at once, for token ids alone. Their work (a pass over ids the loop
        has just decoded from the message, which cost it as much) is less
        than the hop: a thread switch and another turn of the loop. The
        params are the endpoint's own, built (and so checked) from the
        message: ``new_request`` takes them as they are."""
        if waiting.pooling is not None:
            make = functools.partial(self.engine.new_pooling_request, waiting.prompt,
                                     waiting.pooling, req_id=waiting.engine_id,
                                     priority=waiting.message.priority,
                                     lora_request=waiting.message.lora_request,
                                     task=waiting.pooling.task or "embed")
        else:
            make = functools.partial(self.engine.new_request, waiting.prompt, waiting.params,
                                     req_id=waiting.engine_id, priority=waiting.message.priority,
                                     enable_thinking=waiting.message.enable_thinking,
                                     lora_request=waiting.message.lora_request)
        if isinstance(waiting.prompt, str) or "prompt" in waiting.prompt \
                or waiting.params.bad_words:
            made = self.tokenizers.submit(make)
            made.add_done_callback(self._wake)
            return made
        made = Future()
        try:
            made.set_result(make())
        except Exception as e:
            made.set_exception(e)
        return made

    def _admit(self, waiting: _Waiting) -> None:
        """Queue the request made for ``waiting`` (or refuse it), then
        answer the client's later messages with its id."""
        identity, message = waiting.identity, waiting.message
        try:
            request = waiting.request.result()
            self.engine.enqueue(request)
        except Exception as e:
            self._refuse(identity, message, e)
        else:
            params = waiting.params
            detokenizer = (IncrementalDetokenizer(self.engine.tokenizer,
                                                  request.prompt_token_ids,
                                                  params.skip_special_tokens,
                                                  params.spaces_between_special_tokens)
                           if params.detokenize else None)
            self.routes[request.req_id] = _Route(identity, message.request_id, detokenizer)
            self.engine_ids[(identity, message.request_id)] = request.req_id
            if trace.enabled:
                trace.mark("engine_added", message.request_id)
            self.accepts.append((identity, RequestAccepted(
                request_id=message.request_id, prompt_token_ids=request.prompt_token_ids,
                starts_in_reasoning=request.starts_in_reasoning)))
        for reply in waiting.then:
            self._send_in_order(identity, reply)

    def _abort(self, identity: bytes, request_id: str) -> None:
        """Abort a live request, or one still waiting (never admitted then);
        either way its last delta says "abort"."""
        waiting = self.waiting.pop((identity, request_id), None)
        if waiting is None:
            engine_id = self.engine_ids.get((identity, request_id))
            if engine_id is not None:
                self._send_deltas(self.engine.abort([engine_id]))
            return
        if waiting.request is not None:
            waiting.request.cancel()  # a request being made is dropped when it ends
        aborted = Delta(request_id=request_id, token_ids=[], text="", finished=True,
                        finish_reason="abort")
        for reply in [Outputs(deltas=[aborted]), *waiting.then]:
            self._send_in_order(identity, reply)

    def _flush_accepts(self) -> None:
        """Send the acceptances held back (and the refusals queued behind
        them). An acceptance waits until the engine has sent the plan of the
        step after the admission: the client's work on it (an HTTP front end
        starts its response) then runs while the workers compute, not while
        the engine schedules that step."""
        held, self.accepts = self.accepts, []
        for identity, message in held:
            self._reply(identity, message)

    def _refuse(self, identity: bytes, message: GenerateRequest, e: Exception) -> None:
        """Answer ``RequestError``: ``invalid_request`` for an
        ``InvalidRequestError`` (the request's own fault, told to the
        client only), with its ``code`` and ``param``; a ``ProtocolError`` is logged on one line, any other
        exception, the engine's own failure, with its traceback."""
        invalid = isinstance(e, InvalidRequestError)
        if isinstance(e, ProtocolError):
            logger.warning("request %r refused: %s", message.request_id, e)
        elif not invalid:
            logger.error("request %r refused: the engine failed to make it",
                         message.request_id, exc_info=e)
        error = str(e) or type(e).__name__
        refusal = RequestError(request_id=message.request_id, error=error,
                               code=e.code if invalid else None, invalid_request=invalid,
                               param=e.param if invalid else None)
        earlier = self.waiting.get((identity, message.request_id))
        if earlier is not None:  # a request with its id waits: after that one's reply
            earlier.then.append(refusal)
        else:
            self._send_in_order(identity, refusal)

    def _send_in_order(self, identity: bytes, message: msgspec.Struct) -> None:
        """Send now, or after the replies held back (``accepts``), so the
        client's replies keep its messages' order."""
        if self.accepts:
            self.accepts.append((identity, message))
        else:
            self._reply(identity, message)

    # ---- replies -----------------------------------------------------------
    def _send_deltas(self, deltas: list[RequestOutputDelta]) -> None:
        """One ``Outputs`` message per client with news in this step (after
        any acceptance held back: a request's deltas follow its acceptance),
        or several, in order, where their pooled outputs together pass
        ``MAX_POOLED_BYTES`` (``_by_pooled_size``)."""
        self._flush_accepts()
        by_client: dict[bytes, list[Delta]] = defaultdict(list)
        for d in deltas:
            route = self.routes.get(d.req_id)
            if route is None:
                continue
            by_client[route.identity].extend(self._deltas(route, d))
            if d.finished:
                self._forget(d.req_id)
        for identity, items in by_client.items():
            if trace.enabled:
                for item in items:
                    trace.mark("delta_sent", item.request_id)
            for part in _by_pooled_size(items):
                self._reply(identity, Outputs(deltas=part))

    def _deltas(self, route: _Route, d: RequestOutputDelta) -> list[Delta]:
        """One ``Delta`` per new token: a step with speculative decoding
        brings several, and a client that stops at a stop string (the HTTP
        front end) must see where each token's text ends, so that nothing
        after the stop reaches its output."""
        tokens = d.new_token_ids
        if len(tokens) <= 1:
            return [self._delta(route, d, tokens, d.logprobs, d.finished, first=True)]
        last = len(tokens) - 1
        return [self._delta(route, d, [t], None if d.logprobs is None else [d.logprobs[i]],
                            d.finished and i == last, first=i == 0)
                for i, t in enumerate(tokens)]

    def _delta(self, route: _Route, d: RequestOutputDelta, tokens: list[int],
               token_logprobs, finished: bool, first: bool) -> Delta:
        """``first``: the delta that carries the step's prompt logprobs (they
        come once per request). A stop token that ends the request adds no
        text (``shown_token_ids``)."""
        text = ""
        if route.detokenizer is not None:
            # What the detokenizer holds back when the request ends (an
            # incomplete character) is never shown, as in vLLM.
            text = route.detokenizer.feed(shown_token_ids(d, tokens, through_end=finished))
        logprobs = None
        if token_logprobs is not None:
            logprobs = [_candidates(token) for token in token_logprobs]
        prompt_logprobs = None
        if first and d.prompt_logprobs is not None:
            prompt_logprobs = [None if token is None else _candidates(token)
                               for token in d.prompt_logprobs]
        return Delta(request_id=route.request_id, token_ids=list(tokens), text=text,
                     finished=finished, finish_reason=d.finish_reason if finished else None,
                     stop_reason=d.stop_reason if finished else None,
                     logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                     num_cached_tokens=d.num_cached_tokens, embedding=d.pooled)

    def _forget(self, engine_id: str) -> None:
        route = self.routes.pop(engine_id)
        del self.engine_ids[(route.identity, route.request_id)]

    def _reply(self, identity: bytes, message: msgspec.Struct) -> None:
        try:
            self.socket.send_multipart([identity, *self.auth.seal(encode(message))])
        except zmq.ZMQError as e:
            if e.errno != errno.EHOSTUNREACH:
                raise
            self._drop_client(identity)

    def _announce_stop(self, reason: str, failed: bool = True) -> None:
        """Tell every client with a live or waiting request, or with a
        control call unanswered (its work failed); forget them."""
        self._flush_accepts()
        clients = {route.identity for route in self.routes.values()}
        if self.controlling is not None:
            clients.add(self.controlling)
        for identity in clients | {key[0] for key in self.waiting}:
            self._reply(identity, EngineStopped(reason=reason, failed=failed))
        self.routes.clear()
        self.engine_ids.clear()
        self._drop_waiting()

    def _drop_waiting(self, identity: bytes | None = None) -> None:
        """Forget the waiting requests of one client (of all: None); a
        request being made is dropped when it ends."""
        for key in [k for k in self.waiting if identity in (None, k[0])]:
            waiting = self.waiting.pop(key)
            if waiting.request is not None:
                waiting.request.cancel()

    def _drop_client(self, identity: bytes) -> None:
        self._drop_waiting(identity)
        gone = [eid for eid, route in self.routes.items() if route.identity == identity]
        if gone:
            logger.warning("a client is gone; aborting its %d request(s)", len(gone))
        self.engine.abort(gone)
        for engine_id in gone:
            self._forget(engine_id)


def _by_pooled_size(deltas: list[Delta]) -> list[list[Delta]]:
    """``deltas`` in order, cut into runs whose pooled outputs together hold
    at most ``MAX_POOLED_BYTES`` (a delta alone may: the engine refuses a
    request whose output would pass it), so that no message passes the
    socket's bound (token-level rows, one a prompt token, add up fast)."""
    runs, run, size = [], [], 0
    for delta in deltas:
        pooled = len(delta.embedding or b"")
        if run and size + pooled > serde.MAX_POOLED_BYTES:
            runs.append(run)
            run, size = [], 0
        run.append(delta)
        size += pooled
    return [*runs, run]


def _candidates(token: dict) -> list[TokenLogprob]:
    return [TokenLogprob(t, lp.logprob, lp.rank) for t, lp in token.items()]


class ProtocolError(ValueError):
    """A request message this protocol does not allow (an id already in
    use, both prompts or neither, ``n`` other than 1, stop strings): its
    sender's mistake, not its content's, so no front end's user did it."""


def _prompt(message: GenerateRequest) -> str | dict:
    """The engine's prompt of the message: its text, or its ids as a dict;
    a dict of either with its ``cache_salt`` where it has one."""
    if (message.prompt is None) == (message.prompt_token_ids is None):
        raise ProtocolError("give exactly one of prompt (text) and prompt_token_ids")
    prompt = ({"prompt": message.prompt} if message.prompt is not None
              else {"prompt_token_ids": message.prompt_token_ids})
    if message.cache_salt is None:
        return prompt.get("prompt", prompt)
    return prompt | {"cache_salt": message.cache_salt}
