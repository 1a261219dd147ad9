"""``Generation``: the engine requests behind one HTTP request, and the
text events they produce.

An HTTP request asks for ``n`` choices of one or more prompts; each choice
is one engine request, sent over the ``AsyncEngineClient`` with its own id, all
answered on one queue. ``start`` submits them all and waits until the
engine has accepted every one, so a refusal (prompt too long, bad sampling
values) is known before any response byte is sent: the others are then
aborted and ``RequestRefused`` raised with the engine's message (or, for a
refusal that is not the request's fault, ``EngineRefusal``: the server's
own failure). ``events``
then yields each choice's text as it comes, passed through its
``OutputStops``; a choice that meets a stop string is aborted in the
engine (its blocks freed) and finishes with reason "stop". Each choice's
acceptance tells whether its output begins inside its reasoning (the
engine's decision, ``starts_in_reasoning``); under a reasoning parser
(``count_reasoning``) each choice counts its reasoning tokens from there,
which ``usage`` reports as vLLM does. A choice the
engine ends with reason "error" (it could not go on generating it) is not
shown as an answer: ``events`` raises ``GenerationError`` in its place, as
vLLM's server raises its own, which the routes answer as a failure of the
server (``errors.error_answer``: a 500, or a stream's error event).

Invariant: whatever happens (refusal, a client gone, a cancelled task),
``abort_unfinished`` leaves no engine request of this HTTP request running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from engine.prometheus_metrics import Metrics
from engine.request_metrics import RequestTimes
from engine.stop_strings import OutputStops
from ipc.engine_messages import Delta, EngineStopped, RequestAccepted, RequestError, TokenLogprob
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest
from serving.async_client import AsyncEngineClient
from serving.http.reasoning import ReasoningCount
from serving.protocol_core import EngineStoppedError

logger = logging.getLogger(__name__)


class RequestRefused(InvalidRequestError):
    """The engine refused a request for what it asks (HTTP 400); ``code``
    is OpenAI's error code for the reason and ``param`` the field it
    blames, where the engine's refusal names them."""

    def __init__(self, message: str, code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message, param=param, code=code)


class EngineRefusal(RuntimeError):
    """The engine refused a request for a reason that is not the request's
    (``RequestError.invalid_request`` false): a message this server should
    not have sent, or the engine's own failure. The server's failure (HTTP
    500, logged), never told to the client as its error."""


class GenerationError(RuntimeError):
    """A choice ended with finish reason "error": the engine could not go
    on generating it (its output constraint refused the token sampled,
    ``engine.scheduler``). vLLM's server answers such a request with a 500
    (its ``GenerationError``), never as a finished choice; so does this one
    (``errors.error_answer``). Logged once, on one line, where raised."""

    def __init__(self, request_id: str) -> None:
        super().__init__("the engine failed to generate this response: a choice ended "
                         "with finish reason \"error\"")
        self.request_id = request_id


@dataclass
class ChoiceEvent:
    """New text (and the tokens behind it) of one choice; ``finish_reason``
    is set on its last event only, and with it vLLM's ``stop_reason``: the
    stop string met, or the stop token id (None otherwise)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[list[TokenLogprob]] | None
    finish_reason: str | None
    prompt_logprobs: list[list[TokenLogprob] | None] | None = None
    stop_reason: int | str | None = None


@dataclass
class _Choice:
    index: int
    prompt_index: int
    stops: OutputStops
    num_prompt_tokens: int = 0
    prompt_token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_tokens: int = 0
    times: RequestTimes = field(default_factory=RequestTimes)  # arrival: its submission
    finished: bool = False
    starts_in_reasoning: bool = False  # the engine's word, with the acceptance
    reasoning: ReasoningCount | None = None


@dataclass
class Generation:
    link: AsyncEngineClient
    # None: requests whose latencies are no client's (beam search's steps).
    metrics: Metrics | None
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    choices: dict[str, _Choice] = field(default_factory=dict)
    early: list = field(default_factory=list)  # deltas that came while others awaited acceptance
    # Echo with max_tokens 0: the engine samples one token (it always does),
    # which is dropped here, uncounted, and the choice ends as "length".
    discard_output: bool = False
    # A fresh count of a choice's reasoning tokens (a reasoning parser's), or
    # None, given whether the choice's output begins inside its reasoning.
    count_reasoning: Callable[[bool], ReasoningCount | None] | None = None

    async def start(self, prompts: list[list[int]], params: list[dict],
                    stops: list[str], priority: int = 0,
                    max_tokens: list[int | None] | None = None,
                    enable_thinking: bool = True, cache_salt: str | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        """Submit ``params[i]`` for every prompt (choice index = prompt
        index * len(params) + i), at ``priority``, and wait until all are
        accepted; ``max_tokens[p]``, where given, replaces the params'
        ``max_tokens`` for prompt p (a cap its own room limits);
        ``enable_thinking``, ``cache_salt`` and ``lora_request``:
        ``GenerateRequest``'s."""
        try:
            for p, prompt in enumerate(prompts):
                for i, choice_params in enumerate(params):
                    if max_tokens is not None:
                        choice_params = {**choice_params, "max_tokens": max_tokens[p]}
                    request_id = self.link.new_id()
                    self.choices[request_id] = _Choice(p * len(params) + i, p, OutputStops(
                        stops, choice_params.get("include_stop_str_in_output", False),
                        choice_params.get("min_tokens", 0)))
                    self.link.submit(request_id, prompt, choice_params, self.queue, priority,
                                     enable_thinking, cache_salt, lora_request=lora_request)
            await self._await_acceptance()
        except BaseException:
            self.abort_unfinished()
            raise

    async def _await_acceptance(self) -> None:
        waiting = len(self.choices)
        while waiting:
            item = await self.queue.get()
            if isinstance(item, EngineStopped):
                raise EngineStoppedError(item.reason)
            if isinstance(item, RequestError):
                self.choices[item.request_id].finished = True
                self.link.forget(item.request_id)
                if item.invalid_request:
                    raise RequestRefused(item.error, item.code, item.param)
                raise EngineRefusal(f"the engine refused request {item.request_id!r}: "
                                    f"{item.error}")
            if isinstance(item, RequestAccepted):
                choice = self.choices[item.request_id]
                choice.num_prompt_tokens = len(item.prompt_token_ids)
                choice.prompt_token_ids = item.prompt_token_ids
                choice.starts_in_reasoning = item.starts_in_reasoning
                if self.count_reasoning is not None:
                    choice.reasoning = self.count_reasoning(item.starts_in_reasoning)
                waiting -= 1
            else:
                self.early.append(item)

    def starts_in_reasoning(self, index: int) -> bool:
        """Whether choice ``index``'s output begins inside its reasoning, as
        the engine told with its acceptance (``start`` has returned)."""
        return next(c.starts_in_reasoning for c in self.choices.values() if c.index == index)

    def prompts_by_choice(self) -> dict[int, list[int]]:
        """Each choice's prompt as the engine took it, by choice index."""
        return {c.index: c.prompt_token_ids for c in self.choices.values()}

    def prompt_tokens(self) -> int:
        """Prompt tokens, counted once per prompt."""
        per_prompt = {c.prompt_index: c.num_prompt_tokens for c in self.choices.values()}
        return sum(per_prompt.values())

    def completion_tokens(self) -> int:
        return sum(c.num_tokens for c in self.choices.values())

    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache held, counted once per prompt (its
        first choice's: the others may hit what the first computed)."""
        first: dict[int, int] = {}
        for c in sorted(self.choices.values(), key=lambda c: c.index):
            first.setdefault(c.prompt_index, c.num_cached_tokens)
        return sum(first.values())

    def usage(self) -> dict:
        """The response's ``usage``: prompt tokens once per prompt,
        completion tokens over every choice, and the prompt tokens served
        from the prefix cache (``prompt_tokens_details.cached_tokens``);
        under a reasoning parser also vLLM's
        ``completion_tokens_details.reasoning_tokens``, over every choice."""
        prompt, completion = self.prompt_tokens(), self.completion_tokens()
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion,
                 "prompt_tokens_details": {"cached_tokens": self.cached_tokens()}}
        counts = [c.reasoning.count for c in self.choices.values() if c.reasoning is not None]
        if counts:
            usage["completion_tokens_details"] = {"reasoning_tokens": sum(counts)}
        return usage

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        """Every choice's events, in the order the engine produced them;
        ``GenerationError`` instead of the last event of a choice that ended
        with "error" (the caller's ``abort_unfinished`` then stops the
        others)."""
        live = sum(not c.finished for c in self.choices.values())
        while live:
            item = self.early.pop(0) if self.early else await self.queue.get()
            if isinstance(item, EngineStopped):
                raise EngineStoppedError(item.reason)
            if not isinstance(item, Delta):
                continue
            choice = self.choices[item.request_id]
            if choice.finished:
                continue
            event = self._event(item.request_id, choice, item)
            if event.finish_reason == "error":
                logger.error("request %s failed: the engine ended it with finish reason "
                             "\"error\"", item.request_id)
                raise GenerationError(item.request_id)
            if choice.finished:
                live -= 1
            if event.text or event.token_ids or event.finish_reason or event.prompt_logprobs:
                yield event

    def _event(self, request_id: str, choice: _Choice, delta: Delta) -> ChoiceEvent:
        if self.discard_output:
            return self._prompt_only_event(request_id, choice, delta)
        self._observe_latency(choice, len(delta.token_ids))
        choice.num_tokens += len(delta.token_ids)
        if choice.reasoning is not None:
            choice.reasoning.add(delta.token_ids)
        if delta.num_cached_tokens is not None:
            choice.num_cached_tokens = delta.num_cached_tokens
        text = choice.stops.add(delta.text, len(delta.token_ids), last=delta.finished)
        if choice.stops.stopped is not None and not delta.finished:
            self.link.abort(request_id)
        elif delta.finished:
            self.link.forget(request_id)
        reason, stop_reason = None, None
        if choice.stops.stopped is not None:
            reason, stop_reason = "stop", choice.stops.stopped
        elif delta.finished:
            reason, stop_reason = delta.finish_reason, delta.stop_reason
        if reason is not None:
            self._finish(choice, reason)
        return ChoiceEvent(choice.index, text, list(delta.token_ids), delta.logprobs, reason,
                           delta.prompt_logprobs, stop_reason)

    def _finish(self, choice: _Choice, reason: str) -> None:
        choice.finished = True
        if self.metrics is not None:
            self.metrics.finished(reason, time.monotonic() - choice.times.arrival_ts)

    def _prompt_only_event(self, request_id: str, choice: _Choice, delta: Delta) -> ChoiceEvent:
        if delta.num_cached_tokens is not None:
            choice.num_cached_tokens = delta.num_cached_tokens
        if delta.finished:
            self.link.forget(request_id)
        else:
            self.link.abort(request_id)
        self._finish(choice, "length")
        return ChoiceEvent(choice.index, "", [], None, "length", delta.prompt_logprobs)

    def _observe_latency(self, choice: _Choice, num_tokens: int) -> None:
        """Time to the choice's first token, or the gap since its last ones
        shared among the ``num_tokens`` that came now."""
        if num_tokens and self.metrics is not None:
            self.metrics.observe_tokens(choice.times, num_tokens, time.monotonic())

    def abort_unfinished(self) -> None:
        """Abort every engine request of this HTTP request still running."""
        for request_id, choice in self.choices.items():
            if not choice.finished:
                self._finish(choice, "abort")
                self.link.abort(request_id)
