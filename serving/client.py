"""``EngineClient``: drive a ``tprun serve`` engine over its ZeroMQ endpoint.

    with EngineClient("ipc:///tmp/tprun-serve-abc/engine") as client:
        rid = client.submit("Hello", SamplingParams(max_tokens=8))
        for delta in client.stream(rid):
            print(delta.token_ids, delta.text, delta.finish_reason)
        outs = client.generate(["a", {"prompt_token_ids": [1, 2]}])  # blocking

One DEALER socket per client; the server answers each client only about
its own requests, so any number of clients may share one engine. A client
is not thread-safe: give each thread its own. Messages for every request
are read as they come and queued per request, so streams may be consumed
in any order. A refused request raises ``ValueError`` with the server's
message; an engine that stopped raises ``EngineStoppedError``; one that
stays silent for ``timeout_s`` raises ``TimeoutError``.

Every message is sealed with the launch's secret (``ipc.auth``), which the
client finds (``find_secret``) in the key file ``tprun serve`` wrote next
to the endpoint file or the ipc:// socket, or is given. Sealing, opening and
routing are ``serving.protocol_core``'s, shared with the asyncio client; a
dropped reply is counted in ``num_dropped_replies``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import zmq
from tqdm import tqdm

from engine.llm import loras_per_prompt
from engine.llm_engine import cache_salt_of, checked_token_ids
from engine.outputs import RequestOutput
from engine.request_metrics import RequestTimes
from engine.sampling_params import SamplingParams
from ipc.auth import check_secret, read_key_file, sibling_key_file
from ipc.engine_messages import (
    AbortRequest,
    Delta,
    EngineStats,
    EngineStopped,
    GenerateRequest,
    RequestAccepted,
    RequestError,
    StatsRequest,
)
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest
from serving.completion_collector import CompletionCollector
from serving.protocol_core import ClientProtocol, EngineStoppedError, configure_dealer
from serving.request_collector import RequestCollector

__all__ = ["EngineClient", "EngineStoppedError", "find_secret"]


def wait_for_endpoint_file(path: str, timeout_s: float) -> None:
    """Wait until ``tprun serve`` has written its endpoint file (it does
    once the engine is ready, after the key file); ``TimeoutError`` after
    ``timeout_s`` seconds without it."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no endpoint file at {path} after {timeout_s:g} s: is "
                               f"`tprun serve --endpoint-file {path}` running?")
        time.sleep(0.1)


def read_endpoint_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        endpoint = f.read().strip()
    if not endpoint.startswith(("ipc://", "tcp://")):
        raise ValueError(f"{path} does not hold an ipc:// or tcp:// endpoint")
    return endpoint


def find_secret(endpoint: str, secret: bytes | None = None,
                key_file: str | None = None) -> bytes:
    """The secret for ``endpoint`` (an address, or an endpoint file's path):
    ``secret`` if given, else the key in ``key_file``, else the key file
    ``tprun serve`` wrote next to the endpoint file or the ipc:// socket.
    Raises ``ValueError`` saying where it looked."""
    if secret is not None:
        return check_secret(secret)
    if key_file is not None:
        return read_key_file(key_file)
    if "://" not in endpoint:
        return read_key_file(sibling_key_file(endpoint))
    if endpoint.startswith("ipc://"):
        return read_key_file(sibling_key_file(endpoint[len("ipc://"):]))
    raise ValueError(f"no key for {endpoint}: pass key_file= (the key file tprun serve "
                     f"printed at start), secret=, or the endpoint file's path")


def prompt_dict(prompt: str | dict) -> dict:
    """A prompt as the endpoint's message takes it: text as ``{"prompt":
    text}``, a dict with its values checked as ``LLM`` checks them (token
    ids: ``checked_token_ids``, a list of ints after; the salt:
    ``cache_salt_of``); ``InvalidRequestError`` for anything but text,
    ``{"prompt": str}`` or ``{"prompt_token_ids": [int, ...]}``, the dicts
    with an optional ``"cache_salt"``: str. So a prompt's fault is the
    caller's error here, never a message the endpoint cannot read."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if not isinstance(prompt, dict) or set(prompt) - {"cache_salt"} not in (
            {"prompt"}, {"prompt_token_ids"}) or not isinstance(prompt.get("prompt", ""), str):
        raise InvalidRequestError(
            "a prompt is a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
            "the dicts with an optional 'cache_salt': str", param="prompt")
    checked = dict(prompt)
    if "prompt_token_ids" in prompt:
        checked["prompt_token_ids"] = checked_token_ids(prompt["prompt_token_ids"])
    cache_salt_of(prompt)
    return checked


def checked_lora(lora_request) -> LoRARequest | None:
    """``lora_request`` as the endpoint's message takes it: None or a
    ``LoRARequest`` (the engine checks the adapter itself)."""
    if lora_request is not None and not isinstance(lora_request, LoRARequest):
        raise InvalidRequestError(f"lora_request must be a LoRARequest, got "
                                  f"{type(lora_request).__name__}", param="lora_request")
    return lora_request


def checked_priority(priority) -> int:
    """``priority`` as the endpoint's message takes it: an int (not a bool)
    in the signed 64-bit range; ``InvalidRequestError`` otherwise."""
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not -2**63 <= priority < 2**63:
        raise InvalidRequestError(f"priority must be an int, got {priority!r}",
                                  param="priority")
    return priority


def prompt_text(prompt: str | dict) -> str | None:
    """A prompt's text, as a ``RequestOutput`` shows it (None for token ids)."""
    return prompt if isinstance(prompt, str) else prompt.get("prompt")


def _params(params: SamplingParams | dict | None) -> SamplingParams:
    """``SamplingParams`` of what a caller gave (``ValueError`` for a bad dict)."""
    if isinstance(params, SamplingParams):
        return params.checked()
    return SamplingParams.from_dict(params or {})


def _params_dict(params: SamplingParams | dict | None) -> dict:
    if params is None:
        return {}
    if isinstance(params, SamplingParams):
        return params.to_dict()
    return dict(params)


_Item = RequestAccepted | Delta | RequestError | EngineStopped


@dataclass
class _Stream:
    """What has arrived for one request and is not consumed yet, each item
    with the ``time.monotonic()`` it was received at (whenever the caller
    consumes it), and the request's times (its arrival: its submission)."""

    items: deque[tuple[float, _Item]] = field(default_factory=deque)
    prompt_token_ids: list[int] | None = None
    starts_in_reasoning: bool = False
    times: RequestTimes = field(default_factory=RequestTimes)

    def receive(self, item: _Item) -> None:
        self.items.append((time.monotonic(), item))


class EngineClient:
    """``endpoint`` is an ``ipc://`` or ``tcp://`` address, or the path of
    the file ``tprun serve --endpoint-file`` writes once the engine is ready
    (the client waits up to ``ready_timeout_s`` for it, so a client started
    with the server works); ``secret`` or ``key_file`` give the key where
    ``find_secret`` cannot find it."""

    def __init__(self, endpoint: str, timeout_s: float = 300.0, *,
                 secret: bytes | None = None, key_file: str | None = None,
                 ready_timeout_s: float = 300.0):
        if "://" not in endpoint:
            wait_for_endpoint_file(endpoint, ready_timeout_s)
        self._stats: deque[EngineStats] = deque()
        self.protocol = ClientProtocol(find_secret(endpoint, secret, key_file),
                                       on_stats=self._stats.append,
                                       on_unreadable=self._unreadable)
        if "://" not in endpoint:
            endpoint = read_endpoint_file(endpoint)
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        configure_dealer(self.socket, endpoint)
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()

    # ---- requests ----------------------------------------------------------
    def submit(self, prompt: str | dict, sampling_params: SamplingParams | dict | None = None,
               request_id: str | None = None, priority: int = 0,
               enable_thinking: bool = True, lora_request: LoRARequest | None = None) -> str:
        """Send one request; returns its id. ``prompt`` is text,
        ``{"prompt": text}`` or ``{"prompt_token_ids": [...]}``, the dicts
        with an optional ``"cache_salt"``;
        ``sampling_params`` a ``SamplingParams`` or a dict of its fields;
        ``priority`` as ``LLM.generate`` takes it; ``enable_thinking``
        (``GenerateRequest``'s): false turns thinking off under a reasoning
        parser that reads the switch. Where the engine finds the output
        beginning (inside its reasoning or not) is ``starts_in_reasoning``'s.
        ``lora_request``: the LoRA adapter it runs with (None: none)."""
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a string, got {request_id!r}")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use by this client")
        prompt = prompt_dict(prompt)
        message = GenerateRequest(request_id=request_id, prompt=prompt.get("prompt"),
                                  prompt_token_ids=prompt.get("prompt_token_ids"),
                                  sampling_params=_params_dict(sampling_params),
                                  priority=checked_priority(priority),
                                  enable_thinking=enable_thinking,
                                  cache_salt=prompt.get("cache_salt"),
                                  lora_request=checked_lora(lora_request))
        entry = _Stream()
        self.protocol.route(request_id, entry.receive)
        try:
            self._send(message)
        except BaseException:
            self.protocol.unroute(request_id)
            raise
        self._streams[request_id] = entry
        return request_id

    def stream(self, request_id: str) -> Iterator[Delta]:
        """The request's deltas as they come, the last one ``finished``.
        Raises ``ValueError`` if the engine refused the request: an
        ``InvalidRequestError`` when it was refused for what it asks."""
        for _, delta in self._timed_stream(request_id):
            yield delta

    def _timed_stream(self, request_id: str) -> Iterator[tuple[float, Delta]]:
        """``stream``, each delta with the time it was received at."""
        if request_id not in self._streams:
            raise KeyError(f"no live request {request_id!r} on this client")
        entry = self._streams[request_id]
        while True:
            while not entry.items:
                self._receive()
            received_at, item = entry.items.popleft()
            if isinstance(item, RequestAccepted):
                entry.prompt_token_ids = item.prompt_token_ids
                entry.starts_in_reasoning = item.starts_in_reasoning
                continue
            if isinstance(item, EngineStopped):
                raise EngineStoppedError(item.reason)
            if isinstance(item, RequestError):
                self._forget(request_id)
                message = f"request {request_id!r} refused: {item.error}"
                if item.invalid_request:
                    raise InvalidRequestError(message, param=item.param, code=item.code)
                raise ValueError(message)
            if item.finished:
                self._forget(request_id)
            yield received_at, item
            if item.finished:
                return

    def starts_in_reasoning(self, request_id: str) -> bool:
        """Whether the live request's output begins inside its reasoning, as
        the engine decided it under its reasoning parser (False without one):
        waits for the request's acceptance (its refusal raises as
        ``stream`` does)."""
        entry = self._streams[request_id]
        while entry.prompt_token_ids is None and not entry.items:
            self._receive()
        if entry.prompt_token_ids is None:
            item = entry.items[0][1]  # the acceptance, or a refusal or stop (which raise)
            if not isinstance(item, RequestAccepted):
                next(self._timed_stream(request_id))
            entry.items.popleft()
            entry.prompt_token_ids = item.prompt_token_ids
            entry.starts_in_reasoning = item.starts_in_reasoning
        return entry.starts_in_reasoning

    def abort(self, request_id: str) -> None:
        """Ask the engine to stop the request; its stream ends with a delta
        whose ``finish_reason`` is "abort" (unless it finished first)."""
        self._send(AbortRequest(request_id=request_id))

    def generate(self, prompts: str | dict | Iterable[str | dict],
                 sampling_params: SamplingParams | dict | Sequence | None = None,
                 use_tqdm: bool = False,
                 priority: Sequence[int] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in the order of ``prompts``,
        each with its ``n`` completions, as ``LLM.generate`` gives them (and
        takes ``priority`` and ``lora_request`` as it does): the
        client sends the ``n`` engine requests (``SamplingParams.choices``)
        and cuts each one's text at its stop strings (``OutputStops``, on
        each step's text; the engine takes none). If one is refused, the
        others are aborted and ``ValueError`` raised. Each output's
        ``metrics`` are this client's times (``engine.request_metrics``:
        arrival when it sent a request, tokens when it received them; the
        engine's queueing and scheduling, None)."""
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        if sampling_params is None or isinstance(sampling_params, (SamplingParams, dict)):
            sampling_params = [sampling_params] * len(prompts)
        params = [_params(p) for p in sampling_params]
        if len(params) != len(prompts):
            raise ValueError("give one sampling_params, or one per prompt")
        priority = [0] * len(prompts) if priority is None else list(priority)
        if len(priority) != len(prompts):
            raise ValueError(f"give one priority a prompt ({len(prompts)}), got {len(priority)}")
        loras = loras_per_prompt(lora_request, len(prompts))
        ids: list[list[str]] = []
        outputs = []
        try:
            for prompt, p, rank, lora in zip(prompts, params, priority, loras):
                ids.append([self.submit(prompt, dict(c.to_dict(), stop=()), priority=rank,
                                        lora_request=lora)
                            for c in p.choices()])
            with tqdm(total=len(ids), desc="generate", disable=not use_tqdm) as bar:
                for prompt, p, choice_ids in zip(prompts, params, ids):
                    outputs.append(self._collect(prompt, choice_ids, p))
                    bar.update(1)
        except BaseException:
            self._abandon([r for choice_ids in ids[len(outputs):] for r in choice_ids])
            raise
        return outputs

    def _collect(self, prompt: str | dict, choice_ids: list[str],
                 params: SamplingParams) -> RequestOutput:
        """One prompt's output: its choices' completions, each read to its
        end in turn (``serving.request_collector``), its prompt's ids from
        the first choice's acceptance."""
        request = RequestCollector(choice_ids[0], prompt_text(prompt), params,
                                   [self._streams[rid].times for rid in choice_ids])
        entry = self._streams[choice_ids[0]]  # its prompt ids come with the acceptance
        for choice, rid in zip(request.choices, choice_ids):
            self._collect_choice(choice, rid)
        request.prompt_token_ids = entry.prompt_token_ids or []
        return request.final()

    def _collect_choice(self, choice: CompletionCollector, request_id: str) -> None:
        """Feed ``choice`` its engine request's deltas to the last; the
        request is aborted when its text meets a stop string (what the
        engine still sends for it is dropped)."""
        for received_at, delta in self._timed_stream(request_id):
            if choice.add(delta, received_at):
                self.abort(request_id)

    def _abandon(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            if rid in self._streams:
                if self.protocol.stopped is None:
                    self.abort(rid)
                self._forget(rid)

    # ---- engine state ------------------------------------------------------
    def stats(self) -> EngineStats:
        """The engine's queues, KV blocks and counters (a health check too)."""
        self._send(StatsRequest())
        while not self._stats:
            self._receive()
        return self._stats.popleft()

    @property
    def num_dropped_replies(self) -> int:
        """Replies dropped for a bad MAC or bytes that did not decode."""
        return self.protocol.dropped.count

    @property
    def num_unrouted_deltas(self) -> int:
        """Deltas for no live request of this client: of requests it
        abandoned (a generate() that raised)."""
        return self.protocol.num_unrouted_deltas

    # ---- plumbing ----------------------------------------------------------
    def _send(self, message) -> None:
        self.socket.send_multipart(self.protocol.seal(message))

    def _receive(self) -> None:
        """Wait for one valid message and route it; ``EngineStoppedError``
        once the engine has said it stopped."""
        deadline = time.monotonic() + self.timeout_s
        while self.protocol.stopped is None:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self.socket.poll(left_ms):
                raise TimeoutError(
                    f"no answer from the engine at {self.endpoint} within {self.timeout_s} s "
                    f"(an engine with another key drops this client's messages unanswered)")
            if self.protocol.receive(self.socket.recv_multipart()):
                return
        raise EngineStoppedError(self.protocol.stopped)

    @staticmethod
    def _unreadable(error: str) -> None:
        raise ValueError(f"the engine could not read a message: {error}")

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self.protocol.unroute(request_id)

    def close(self) -> None:
        self.socket.close()
        self.ctx.term()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
