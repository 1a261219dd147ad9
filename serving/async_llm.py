"""``AsyncLLM``: vLLM's asyncio engine API (V1's ``AsyncLLM``, which vLLM
also exports as ``AsyncLLMEngine``), for custom async servers and pipelines.

    async with AsyncLLM(model="tiny", device="cpu") as llm:
        params = SamplingParams(max_tokens=16, output_kind=RequestOutputKind.DELTA)
        async for out in llm.generate("Hello", params, request_id="r1"):
            print(out.outputs[0].text, end="")

The engine runs in the background as ``tprun serve`` runs it: the serving
loop (``serving.endpoint.EngineServer``, ``LLMEngine.step`` in a loop) on a
thread of its own, and this object one more client of it
(``serving.async_client.AsyncEngineClient``) through the server socket's
in-process address, its messages sealed with a secret of its own. So
admission, tokenizing a text prompt, aborts and the engine's failure are
the endpoint's, word for word; the engine's state changes in the loop's
thread only. The client is made in the event loop of the first
``generate`` (construction may happen outside any loop, as vLLM allows);
a later loop (another ``asyncio.run``) gets a client of its own once the
earlier one has no live request.

``generate`` runs the prompt's ``n`` engine requests
(``SamplingParams.choices``) and gathers their deltas
(``serving.request_collector.RequestCollector``: stop strings, logprobs,
the output kinds); its invariants, vLLM's: the last output it yields is
``finished``; nothing is yielded before a refusal (bad parameters, a
duplicate live request id, a prompt the engine refuses raise from the first
``__anext__``); a request id is live from that first ``__anext__``
until the iterator hands over the last output (free then, whether the
iterator is read on or not) or is left; leaving the iterator early
(``break``, ``aclose``, a cancelled task) aborts the request in the engine;
``abort(request_id)`` ends it too, the iterator still yielding its last
output (finish reason "abort"), with the prompt's token ids as every
output has them, also where the abort came before the engine had
tokenized a text prompt (``AsyncLLM`` then tokenizes it, as the engine
would have). An engine that stopped, failed or shut
down, raises ``EngineDeadError`` in every waiting ``generate`` and in
every later one, but for a request the engine finished first: its
``generate`` yields its outputs, the last one finished, as vLLM's does for
a request whose outputs were processed before the engine died. Which
requests those are does not depend on when the event loop last read its
socket: the client reads every reply the loop sent before it ended, then
tells the others (``AsyncEngineClient.stop_after_reading``).

Call ``generate``, ``abort`` and ``shutdown`` from the event loop's thread
(``shutdown`` also once no loop runs): the client is not thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterable

import torch

from engine.config import EngineConfig
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.request_metrics import RequestTimes
from engine.sampling_params import SamplingParams
from ipc.auth import new_secret
from ipc.engine_messages import Delta, EngineStats, EngineStopped, RequestAccepted, RequestError
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest
from serving.async_client import AsyncEngineClient
from serving.client import checked_lora, checked_priority, prompt_dict, prompt_text
from serving.endpoint import Endpoint, EngineServer
from serving.protocol_core import EngineStoppedError
from serving.request_collector import RequestCollector

logger = logging.getLogger(__name__)

_SHUT_DOWN = "the engine was shut down"


class EngineDeadError(EngineStoppedError):
    """vLLM's name: the engine behind an ``AsyncLLM`` has stopped (it
    failed, or was shut down). An ``EngineStoppedError``, as tprun's other
    clients raise it."""


class AsyncLLM:
    """``AsyncLLM(model="tiny", device="cpu", ...)``: keyword arguments are
    ``EngineConfig``'s fields, as ``LLM`` takes them. Construction loads
    the model and starts the engine's loop (it blocks, as ``LLM``'s does).
    Use ``async with``, or call ``shutdown()``; the garbage collector
    shuts down an ``AsyncLLM`` nothing refers to."""

    def __init__(self, model: str = "tiny", **kwargs):
        self._start(engine_config("AsyncLLM", model, kwargs))

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncLLM:
        llm = cls.__new__(cls)
        llm._start(config)
        return llm

    def _start(self, config: EngineConfig) -> None:
        self._background = _Background(config)
        # Holds the background, not this object, so an AsyncLLM nobody
        # holds is collected (and shut down); dead once shut down.
        self._finalizer = weakref.finalize(self, self._background.stop)
        self._requests: dict[str, list[str]] = {}  # live request id -> its engine ids
        self._ids = itertools.count()

    # ---- requests ----------------------------------------------------------
    async def generate(self, prompt: str | dict, sampling_params: SamplingParams | None,
                       request_id: str, *, priority: int = 0,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """The request's outputs as ``sampling_params.output_kind`` asks
        (None: the model's recommended sampling, as ``LLM``'s); ``prompt``
        as ``LLM.generate`` takes one; ``priority`` and ``lora_request`` its
        ones."""
        client = await self._connect()
        params = self._params(sampling_params)
        prompt = prompt_dict(prompt)
        priority = checked_priority(priority)
        if not isinstance(request_id, str):
            raise InvalidRequestError(f"request_id must be a string, got {request_id!r}",
                                      param="request_id")
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running",
                                      param="request_id")
        choices = params.choices()
        engine_ids = [f"async-{next(self._ids)}" for _ in choices]
        index = {engine_id: i for i, engine_id in enumerate(engine_ids)}
        request = RequestCollector(request_id, prompt_text(prompt), params,
                                   [RequestTimes() for _ in choices], self.get_tokenizer())
        queue = _StampedQueue()
        self._requests[request_id] = engine_ids
        try:
            for engine_id, choice in zip(engine_ids, choices):
                try:
                    client.submit(engine_id, prompt.get("prompt_token_ids"),
                                  dict(choice.to_dict(), stop=()), queue, priority=priority,
                                  cache_salt=prompt.get("cache_salt"),
                                  prompt=prompt.get("prompt"),
                                  lora_request=checked_lora(lora_request))
                except EngineStoppedError as e:  # the engine stopped since ``_connect``
                    raise EngineDeadError(str(e)) from None
            while not request.finished:
                items = [await queue.get()]
                while not queue.empty():  # all that came meanwhile: one output
                    items.append(queue.get_nowait())
                for received_at, item in items:
                    if request.finished:
                        break  # what came after its last delta (the engine's stop) is not its
                    _take(item, received_at, request, index, client)
                if request.finished:  # its id is free before its last output is read
                    self._release(request_id, engine_ids)
                output = request.output()
                if output is not None:
                    if not output.prompt_token_ids:  # choices that ended before any was accepted
                        output.prompt_token_ids = request.prompt_token_ids = (
                            await self._unannounced_prompt_token_ids(prompt, params))
                    yield output
        finally:
            self._release(request_id, engine_ids)
            for engine_id in engine_ids:
                client.abort(engine_id)  # no-op for those finished

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """End live requests (an id that is not live, or an engine that
        stopped: nothing); each one's ``generate`` yields its last output,
        finish reason "abort"."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        client = self._background.client
        if client is None:  # shut down: its waiting generates raise EngineDeadError
            return
        for rid in ids:
            for engine_id in self._requests.get(rid, ()):
                client.stop_request(engine_id)

    # ---- engine --------------------------------------------------------------
    def get_tokenizer(self):
        return self._background.engine.tokenizer

    async def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` samples with given no parameters: the model's
        recommended ones (``LLM.get_default_sampling_params``)."""
        return SamplingParams(**self._background.engine.sampling_defaults)

    async def stats(self) -> EngineStats:
        """The engine's queues, KV blocks and counters (``EngineClient.stats``'s)."""
        return await (await self._connect()).stats()

    async def start_profile(self, profile_prefix: str | None = None) -> None:
        """vLLM's: start every worker's torch profiler (``LLMEngine.start_profile``,
        through the engine's loop); ``RuntimeError`` without ``profiler_config``."""
        await (await self._connect()).profile(True, profile_prefix)

    async def stop_profile(self) -> None:
        """vLLM's: stop the profilers; returns once every trace is written."""
        await (await self._connect()).profile(False)

    async def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (``enable_sleep_mode``; ``LLM.sleep`` says what
        each level frees): running requests end as "abort"; requests sent
        while the engine sleeps wait and run once it is woken. The engine's
        refusal (sleep mode off, a bad level) is a ``RuntimeError`` with its
        reason."""
        await self._control("sleep", level=level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what ``sleep`` freed: ``tags`` "weights" and/or "kv_cache"
        (None: all)."""
        await self._control("wake_up", tags=tags)

    async def is_sleeping(self) -> bool:
        return (await self._control("is_sleeping")).value

    async def reset_prefix_cache(self) -> bool:
        """Whether the prefix cache was emptied (not while a request runs)."""
        return (await self._control("reset_prefix_cache")).value

    async def _control(self, method: str, level: int = 1, tags: list[str] | None = None):
        done = await (await self._connect()).control(method, level, tags)
        if done.error is not None:
            raise RuntimeError(done.error)
        return done

    async def check_health(self) -> None:
        """vLLM's: ``EngineDeadError`` once the engine has stopped."""
        if self.errored:
            raise self.dead_error

    @property
    def errored(self) -> bool:
        """The engine has stopped (failed, or shut down)."""
        return self._stopped() is not None

    def _stopped(self) -> str | None:
        """Why the engine stopped, as the loop's thread or the client heard
        it first (the loop tells its clients before its thread ends)."""
        client = self._background.client
        return self._background.dead or (client.dead if client is not None else None)

    @property
    def is_running(self) -> bool:
        return not self.errored

    @property
    def is_stopped(self) -> bool:
        return self.errored

    @property
    def dead_error(self) -> EngineDeadError:
        return EngineDeadError(self._stopped() or "the engine is running")

    def shutdown(self) -> None:
        """Stop the engine's loop and the engine (every waiting ``generate``
        raises ``EngineDeadError``); a second call does nothing."""
        self._finalizer()

    async def __aenter__(self) -> AsyncLLM:
        return self

    async def __aexit__(self, *exc) -> None:
        self.shutdown()

    # ---- plumbing --------------------------------------------------------
    async def _connect(self) -> AsyncEngineClient:
        """The client of this event loop (made once a loop asks)."""
        if self.errored:
            raise self.dead_error
        return await self._background.connect(bool(self._requests))

    def _release(self, request_id: str, engine_ids: list[str]) -> None:
        """``request_id`` is no longer live, if it still names ``engine_ids``
        (a later request may run under the id once this one has finished)."""
        if self._requests.get(request_id) is engine_ids:
            del self._requests[request_id]

    async def _unannounced_prompt_token_ids(self, prompt: dict,
                                            params: SamplingParams) -> list[int]:
        """The prompt's token ids where the engine never told them: every
        choice that has ended so far was aborted while the server still
        admitted it (tokenizing its text, compiling its grammar), so no
        ``RequestAccepted`` came. They are the engine's own rule
        (``LLMEngine.prompt_token_ids``), as vLLM's abort output carries
        the ids its front end tokenized before sending the request; text
        is tokenized off the event loop, as the server tokenizes it. A
        prompt the engine would refuse (a ``truncate_prompt_tokens`` above
        ``max_model_len``) has none: []."""
        engine = self._background.engine
        try:
            if "prompt" in prompt:
                return await asyncio.to_thread(engine.prompt_token_ids, prompt, params)
            return engine.prompt_token_ids(prompt, params)
        except InvalidRequestError:
            return []

    def _params(self, params: SamplingParams | None) -> SamplingParams:
        if params is None:
            return SamplingParams(**self._background.engine.sampling_defaults)
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"sampling_params must be a SamplingParams, got "
                                      f"{type(params).__name__}")
        return params.checked()


AsyncLLMEngine = AsyncLLM  # the name vLLM exports it by (``from vllm import AsyncLLMEngine``)


def _take(item, received_at: float, request: RequestCollector, index: dict[str, int],
          client: AsyncEngineClient) -> None:
    """One reply for one of ``request``'s engine requests (``index``: its
    choice); a refusal or the engine's stop raises."""
    if isinstance(item, Delta):
        choice = index[item.request_id]
        if request.choices[choice].add(item, received_at):
            client.abort(item.request_id)  # its text met a stop string
        elif item.finished:
            client.forget(item.request_id)
    elif isinstance(item, RequestAccepted):
        if not request.prompt_token_ids:  # the choices share their prompt: the first accepted
            request.prompt_token_ids = item.prompt_token_ids
    elif isinstance(item, RequestError):
        message = f"request {request.request_id!r} refused: {item.error}"
        if item.invalid_request:
            raise InvalidRequestError(message, param=item.param, code=item.code)
        raise ValueError(message)
    elif isinstance(item, EngineStopped):
        raise EngineDeadError(item.reason)


class _StampedQueue(asyncio.Queue):
    """An asyncio queue that keeps each item with the ``time.monotonic()``
    it arrived at (a token's time is its receipt, not its reading)."""

    def put_nowait(self, item) -> None:
        super().put_nowait((time.monotonic(), item))


class _Background:
    """The engine, its serving loop's thread and the event loop's client:
    what shutting down stops, held apart from the ``AsyncLLM`` so that the
    thread does not keep it alive. ``dead``: why the loop ended, once it has."""

    def __init__(self, config: EngineConfig) -> None:
        # A worker in this process (TP=1) sizes torch's thread pool for
        # itself; the caller's setting comes back at shutdown (as ``LLM``).
        self.caller_num_threads = torch.get_num_threads()
        try:
            self.engine = LLMEngine(config)
        except BaseException:
            torch.set_num_threads(self.caller_num_threads)
            raise
        self.secret = new_secret()
        try:
            self.server = EngineServer(self.engine, Endpoint.create(), secret=self.secret)
        except BaseException:
            self._stop_engine()
            raise
        self.client: AsyncEngineClient | None = None
        self.dead: str | None = None
        self.failed = False
        self.thread = threading.Thread(target=self._serve, name="tprun-engine-loop",
                                       daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.server.serve()
        except BaseException as e:
            self.dead, self.failed = f"the engine failed: {e}", True
            logger.error("the engine's loop ended", exc_info=e)
        else:
            self.dead = _SHUT_DOWN
        client = self.client
        if client is not None and client.loop is not None and not client.loop.is_closed():
            # Requests sent while the loop was ending hear it too.
            try:
                client.loop.call_soon_threadsafe(client.stop_after_reading, self.dead,
                                                 self.failed)
            except RuntimeError:
                pass  # the event loop closed meanwhile

    async def connect(self, has_live_requests: bool) -> AsyncEngineClient:
        """The client of the running event loop: the one made before, or,
        in another loop, a new one (the old one closed; refused while it
        has live requests in a loop that still runs)."""
        loop = asyncio.get_running_loop()
        client = self.client
        if client is not None and client.loop is not loop:
            if has_live_requests and not client.loop.is_closed():
                raise RuntimeError("AsyncLLM serves one event loop at a time: another loop "
                                   "has requests running")
            client.close_now()
            client = self.client = None
        if client is None:
            client = AsyncEngineClient(self.server.inproc_address, self.secret,
                                       context=self.server.ctx)
            await client.start()
            self.client = client
            if self.dead is not None:  # the loop ended as it was made, and told no client
                raise EngineDeadError(self.dead)
        return client

    def stop(self) -> None:
        """Stop the loop, tell the client's waiting requests (after the
        replies the loop sent before it ended: ``stop_after_reading``),
        close the client, the server and the engine. Called on the loop's own thread
        (the garbage collector may finalize an ``AsyncLLM`` on any thread),
        which cannot wait for itself to end, it leaves that to a thread of
        its own."""
        if threading.current_thread() is self.thread:
            threading.Thread(target=self.stop, name="tprun-engine-stop").start()
            return
        self.server.stop()
        self.thread.join()  # it has set ``dead``
        client, self.client = self.client, None
        if client is not None:
            client.stop_after_reading(self.dead, self.failed)
            client.close_now()
        try:
            self.server.close()
        finally:
            self._stop_engine()

    def _stop_engine(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            torch.set_num_threads(self.caller_num_threads)
