"""OpenAI's Responses API: ``POST /v1/responses``, and with the response
store on, ``GET /v1/responses/{id}``, ``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items`` and ``POST
/v1/responses/{id}/cancel``.

A request is served as the chat request it amounts to, through the chat
route's own steps (``responses_input.py``): its ``input`` (a text: one user
message; or items: messages, earlier function calls and their outputs)
after its ``instructions`` (a system message first) and, with
``previous_response_id``, after the stored conversation that response ended
(``response_store.py``) becomes ``messages``; its function ``tools`` and
``tool_choice`` the chat's (``tools.py``: a named or required choice holds
the output to the tools' schemas, "auto" reads calls with the server's
tool-call parser); the model's chat template renders them
(``serving_chat.chat_prompt``, with ``reasoning.effort`` as the chat's
``reasoning_effort``; ``reasoning.summary`` is only echoed, as vLLM writes
no summary), ``max_output_tokens``, ``temperature``,
``top_p`` and vLLM's fields (its sampling ones, ``logit_bias``,
``skip_special_tokens``, ``include_stop_str_in_output``,
``structured_outputs``) become the chat's sampling parameters
(``sampling.py``, with the model's recommended defaults), and
``text.format`` (or vLLM's ``structured_outputs``, not both, nor either
beside a named or required tool choice) the output's structured-output
constraint (``structured.text_format_constraint``). With ``include``
"message.output_text.logprobs" the engine sends each token's logprobs with
``top_logprobs`` alternatives (-1: the whole vocabulary, under the chat's
rule, ``sampling.check_logprobs``), shown as the chat shows them
(``LogprobsFormatter.chat``); without it ``top_logprobs`` asks for nothing,
as in vLLM. They are the message text's, so beside a tool choice other
than "none" (whose answer may be, or is, calls) asking for them is a 400
naming ``include`` (``_num_top``). Where the engine finds the answer
beginning inside its reasoning (under the server's reasoning parser), they
are its answer's tokens' alone, those after the end tag
(``reasoning.AnswerTokens``): the ``reasoning`` item has no field for
them and the tag is neither's, so theirs go nowhere, as in vLLM's
stream (its whole answer attaches every output token's to its text,
reasoning and tag too, which then does not spell the text).
With a reasoning parser (``--reasoning-parser``) the reasoning is split
off the answer as the chat route splits it (``answer_reader.Reading``)
and comes first, as a ``reasoning`` item (vLLM's). The answer's items are built by
``responses_items.py`` and the Response by ``responses_output.py``, whole
or streamed: ``response.created`` and ``response.in_progress``, each
item's events, then the finished
response in the event its status names, as OpenAI ends a stream:
``response.completed``, or ``response.incomplete`` when
``max_output_tokens`` cut it (vLLM sends ``response.completed`` for both;
the ``openai`` client's stream events have both, and a client that reads
the last event's type learns what the whole answer's ``status`` says).
A stream's pieces group the server's ``--stream-interval`` new tokens, as
vLLM's output processor groups every route's stream (``stream_interval.py``).
What does not fit the model's context is refused
before the engine sees it (``check_context``), so the error names this
API's fields (``input``, ``max_output_tokens``), not the chat's
``max_tokens``; an empty conversation names ``input``. With ``truncation``
"auto" (or null, as vLLM reads it) an input too long for the context is
first cut to its last tokens,
as vLLM cuts it (``truncated_input``). ``max_tool_calls`` is echoed and
limits nothing: it counts built-in tools' calls, and this server runs none.

As vLLM's server: the store is off by default, and then a request's
``store`` (true unless the client says otherwise; null is false, as vLLM
tests it) is served without storing; ``previous_response_id`` and the routes of a stored response
answer 404 for a response the server does not hold. ``DELETE`` answers
OpenAI's ``{"id", "object": "response.deleted", "deleted": true}`` (vLLM
has no such route); the response is then unknown to every route and to
``previous_response_id``. ``input_items`` lists the items the response was
generated from (``responses_input_items.py``; vLLM has no such route
either).

With ``background`` (vLLM's rules: it needs the store on and the request's
``store`` left true, not false nor null, else a 400 naming it) the engine accepts the request
and the call returns at once: the response stored "queued", or with
``stream`` its events, followed as they come; as OpenAI streams a
background response, ``response.created`` and ``response.queued`` show it
"queued", as polling does, and ``response.in_progress`` comes at the
engine's first output, when it is stored so (vLLM's background stream is
its foreground one, "in_progress" from the first event). Its task
(``responses_background.BackgroundRuns``) runs on: the response is stored
"in_progress" at the engine's first output and finished as any other
(``_Run.in_background``), or "failed" when the engine stops first; when
its task is done, however it ended, ``_Run.background_ended`` aborts what
the engine still runs of it and closes its events. ``GET``
polls it; with ``stream`` (a streamed background response only) it gives
its events after ``starting_after``, the stored ones and then each new
one (``responses_background.EventLog``). ``POST .../cancel`` stores it
"cancelled" and cancels its task, which aborts its engine request (its KV
blocks freed); as vLLM's, cancelling any other response, one not run in
the background or one finished, is a 400. A client that leaves does not
cancel it; ``DELETE`` does, and so does the server's shutdown (the
response then stored "cancelled"). A running
response cannot be continued yet: ``previous_response_id`` naming it is a
400.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.request import ContextFields, check_context_length
from engine.structured_outputs.params import StructuredOutputsParams
from engine.tool_depth import check_tool_depth
from ipc.errors import InvalidRequestError
from serving.http.errors import error_answer
from serving.http.generation import ChoiceEvent, Generation, GenerationError
from serving.http.protocol import FieldError, ResponsesRequest
from serving.http.reasoning import AnswerTokens
from serving.http.response_store import RUNNING, ResponseStore, StoredResponse, stored
from serving.http.responses_background import EventLog
from serving.http.responses_input import (
    chat_request,
    input_messages,
    instruction_messages,
    output_messages,
    tool_choice,
)
from serving.http.responses_input_items import items_page, read_query, stored_input_items
from serving.http.responses_items import Event, OutputItems
from serving.http.responses_output import ResponseEvents, ResponseShape, status_of
from serving.http.sampling import capped_max_tokens, check_logprobs, choice_params
from serving.http.serving_chat import chat_prompt, enable_thinking, reading_of
from serving.http.state import ServerState
from serving.http.stream_interval import grouped
from serving.http.streaming import followed_stream, respond
from serving.http.structured import text_format_constraint
from serving.http.tools import ToolChoice, rendered_tools
from serving.protocol_core import EngineStoppedError

logger = logging.getLogger(__name__)


async def create_response(state: ServerState, request: ResponsesRequest,
                          raw: Request) -> Response:
    state.check_model(request.model)
    request.check_supported()
    check_background(request, state.response_store)
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise FieldError("max_output_tokens", f"max_output_tokens must be at least 1, got "
                                              f"{request.max_output_tokens}")
    previous = _previous(state, request)
    history = [] if previous is None else previous.conversation
    turn = input_messages(request.input)
    messages = [*instruction_messages(request), *history, *turn]
    if not messages:
        raise FieldError("input", "input must not be empty: give a text or at least one "
                                  "message (or instructions, or a previous_response_id)")
    chat = chat_request(request, messages)
    check_tool_depth(rendered_tools(chat))  # before anything walks them
    tools = tool_choice(request, chat, state.tool_call_parser)
    constraint = _constraint(request, tools)  # None: chat's structured_outputs
    num_top = _num_top(request, tools)
    check_logprobs(state.max_logprobs, state.vocab_size, top_logprobs=num_top)
    prompt = await asyncio.to_thread(chat_prompt, state, chat)  # off the event loop
    prompt = truncated_input(request, prompt, state.max_model_len)
    reading = reading_of(state, chat, tools)
    max_tokens = capped_max_tokens(chat.max_completion_tokens, state.sampling_defaults,
                                   state.max_model_len - len(prompt))
    check_context(request, len(prompt), max_tokens, state.max_model_len)
    params = choice_params(chat, max_tokens, num_top, constraint=constraint,
                           defaults=state.sampling_defaults,
                           skip_special_tokens=tools.skip_special_tokens(chat.skip_special_tokens))
    generation = Generation(state.link, state.metrics, count_reasoning=reading.reasoning_count)
    await generation.start([prompt], params, chat.stop_strings(), request.priority,
                           enable_thinking=enable_thinking(chat), cache_salt=chat.cache_salt,
                           lora_request=state.lora_request(request.model))
    in_reasoning = reading.reasoning is not None and generation.starts_in_reasoning(0)
    answer = None if reading.reasoning is None else reading.reasoning.answer_tokens(in_reasoning)
    store = state.response_store if request.stores else None
    items = [] if store is None else stored_input_items(previous, request.input)
    log = EventLog() if request.background and request.stream else None
    run = _Run(state, generation, ResponseShape(_echo(state, request, params[0], store)),
               OutputItems(reading.items_reader(in_reasoning)), num_top, answer, store,
               [*history, *turn], items,
               status="queued" if request.background else "in_progress", log=log,
               interval=state.stream_interval if request.stream else 1)
    if request.background:
        return _start_in_background(state, run)
    return await respond(raw, generation, bool(request.stream), run.events, run.collect)


def check_background(request: ResponsesRequest, store: ResponseStore | None) -> None:
    """``background`` needs the response store, on in the server and left
    on by the request (vLLM's rules); ``FieldError`` naming it else."""
    if not request.background:
        return
    if not request.stores:
        raise FieldError("background", "background can only be used when store is true")
    if store is None:
        raise FieldError("background", "background needs the response store, which this "
                                       "server does not keep: start it with "
                                       "--enable-responses-api-store")


def _previous(state: ServerState, request: ResponsesRequest) -> StoredResponse | None:
    """The stored response ``previous_response_id`` names (None: none
    named); a 404 for one not held, a 400 for one still running, whose
    answer is not there to continue."""
    if request.previous_response_id is None:
        return None
    previous = stored(state.response_store, request.previous_response_id,
                      "previous_response_id")
    if previous.running:
        raise FieldError("previous_response_id",
                         f"Response with id {request.previous_response_id!r} is still "
                         f"{previous.body['status']}: continue it once it has finished")
    return previous


def _start_in_background(state: ServerState, run: _Run) -> Response:
    """Store the response "queued", run it on in its own task
    (``BackgroundRuns``, which calls ``run.background_ended`` when the task
    is done) and answer at once: the queued response, or, for one that
    streams (``run.log``), its events followed from the first. A client
    that leaves that stream stops following it; the response runs on."""
    queued = run.shape.started(run.status)
    run.save(queued, run.conversation)
    state.background.start(run.shape.id, run.in_background(), run.background_ended)
    if run.log is not None:
        return followed_stream(run.log.follow())
    return JSONResponse(queued)


def _constraint(request: ResponsesRequest, tools: ToolChoice) -> StructuredOutputsParams | None:
    """The output's constraint: a named or required tool choice's, or
    ``text.format``'s; ``FieldError`` for both, or for ``text.format``
    beside vLLM's ``structured_outputs``."""
    text_format = request.text.format if request.text else None
    if text_format is not None and request.structured_outputs is not None:
        raise FieldError("structured_outputs", "give text.format or structured_outputs, "
                                               "not both")
    from_format = text_format_constraint(text_format)
    from_tools = tools.constraint()
    if from_tools is not None and from_format is not None:
        raise FieldError("text.format", "a named or required tool_choice holds the output to "
                                        "its tools' schemas: give it without text.format (one "
                                        "constraint per request)")
    return from_tools if from_tools is not None else from_format


def _num_top(request: ResponsesRequest, tools: ToolChoice) -> int | None:
    """The top logprobs each token comes with (None: no logprobs). They
    are a message's text's, so they are served for a plain answer only
    (no tools, or tool_choice "none"); asked for beside any other tool
    choice they are a ``FieldError`` naming ``include``, not an answer
    silently without them (vLLM's): with "auto" which tokens are text and
    which a call's is not known, and a named or required choice's answer
    is calls, with no text to hold them (the chat API gives a forced
    call's token logprobs)."""
    if not request.output_logprobs:
        return None
    if tools.mode == "auto":
        raise FieldError("include", "message.output_text.logprobs is not served with "
                                    'tool_choice "auto": which tokens are the message\'s text and '
                                    "which a call's is not known; ask with tool_choice \"none\" "
                                    "for the text's logprobs")
    if tools.mode != "none":
        raise FieldError("include", "message.output_text.logprobs is not served with a named "
                                    "or required tool_choice: its answer is function calls, "
                                    "which have no output text to hold logprobs; ask with "
                                    'tool_choice "none" for the text\'s logprobs, or through '
                                    "/v1/chat/completions for a call's token logprobs")
    return request.top_logprobs or 0


def truncated_input(request: ResponsesRequest, prompt: list[int],
                    max_model_len: int) -> list[int]:
    """The rendered input as the engine gets it. With ``truncation`` "auto",
    vLLM's rule: its last ``max_model_len - max_output_tokens`` tokens (all
    of the context without ``max_output_tokens``; the front is cut, as
    vLLM's tokenizer truncates on the left), so an input too long for the
    context is answered from its end instead of refused. What is left goes
    through the context rule as any input (``check_context``): cut to the
    whole context, it leaves no room for output and is a 400 naming
    ``input``, as vLLM answers it; a ``max_output_tokens`` that leaves no
    room for any input cuts nothing and is the 400 that names it.
    Otherwise (``truncation`` "disabled", the default) the input is whole.
    A null ``truncation`` cuts as "auto" does (``ResponsesRequest.truncates``)."""
    if not request.truncates:
        return prompt
    room = max_model_len - (request.max_output_tokens or 0)
    return prompt[-room:] if 0 < room < len(prompt) else prompt


# The context rule's error names this API's fields, not the chat's.
RESPONSES_FIELDS = ContextFields(prompt="input", max_tokens="max_output_tokens")


def check_context(request: ResponsesRequest, num_input_tokens: int, max_tokens: int | None,
                  max_model_len: int) -> None:
    """The engine's context rule (``engine.request.check_context_length``)
    ahead of the engine, in this API's terms: the input must leave room for
    output, and with ``max_output_tokens`` given, ``max_tokens`` (what the
    engine would be sent: the request's, under the recommended cap) must
    fit beside it; the error shows the request's own value. Two calls,
    input first: an input that fills the context is blamed on ``input``
    even beside ``max_output_tokens``, whereas the engine's one call, given
    ``max_tokens``, judges only the sum (and names ``max_tokens``). With
    ``truncation`` "auto" and a ``max_output_tokens`` that leaves no room
    for any input, the sum goes first: the input would have been cut to
    fit, so ``max_output_tokens`` is what the error names (as vLLM's),
    however long the input."""
    given = request.max_output_tokens
    if request.truncates and given is not None and given >= max_model_len:
        check_context_length(num_input_tokens, given, max_model_len, RESPONSES_FIELDS)
    check_context_length(num_input_tokens, None, max_model_len, RESPONSES_FIELDS)
    if given is not None and max_tokens is not None:
        check_context_length(num_input_tokens, max_tokens, max_model_len, RESPONSES_FIELDS,
                             shown_max_tokens=given)


def _echo(state: ServerState, request: ResponsesRequest, params: dict,
          store: ResponseStore | None) -> dict:
    """The request fields a Response repeats; temperature and top_p as the
    engine runs them (the request's, else the model's defaults)."""
    return {"model": state.shown_model(request.model), "instructions": request.instructions,
            "metadata": request.metadata, "max_output_tokens": request.max_output_tokens,
            "temperature": params["temperature"], "top_p": params["top_p"],
            "previous_response_id": request.previous_response_id,
            "text": request.text.model_dump(exclude_none=True) if request.text else
            {"format": {"type": "text"}},
            "tool_choice": request.tool_choice or "auto",
            "tools": [tool.model_dump(exclude_unset=True) for tool in request.tools or []],
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "truncation": "auto" if request.truncates else "disabled",
            "max_tool_calls": request.max_tool_calls,
            "top_logprobs": request.top_logprobs or 0,
            "reasoning": request.reasoning.model_dump() if request.reasoning else None,
            "background": bool(request.background),
            "service_tier": request.service_tier or "auto", "store": store is not None,
            "user": request.user}


@dataclass
class _Run:
    """One response as the engine generates it: what its whole answer and
    its stream share. ``conversation``: the chat messages before the
    answer (without instructions), and ``input_items`` the same as OpenAI
    lists them, stored with it. A background one is stored at each change
    of its ``status``, with its events (``log``, given to a background one
    that streams, None else) when it streams. ``interval``: how many new
    tokens a streamed response's piece groups, the server's
    ``--stream-interval`` (``stream_interval.py``; vLLM groups every
    route's stream so, and its Responses request has no ``stream_interval``
    of its own); 1 for a response answered whole.

    ``status`` goes as the stored one: a background response starts
    "queued" and is "in_progress" from the engine's first output
    (``_begin``), a foreground one "in_progress" from the start; then
    "completed" or "incomplete" (``finish``), or "failed" (``in_background``,
    when it cannot finish). "cancelled" is the store's alone: the cancel
    route, DELETE and the shutdown cancel the task from outside."""

    state: ServerState
    generation: Generation
    shape: ResponseShape
    items: OutputItems
    num_top: int | None  # logprobs: the top alternatives per token (None: none)
    answer: AnswerTokens | None  # which tokens are the answer's (None: every one)
    store: ResponseStore | None
    conversation: list[dict]
    input_items: list[dict]
    status: str = "in_progress"
    log: EventLog | None = None
    finish_reason: str | None = None
    stopped: str | None = None  # why the engine stopped before the end, if it did
    interval: int = 1

    async def steps(self) -> AsyncIterator[list[Event]]:
        """The events of each piece of the answer, as it comes (grouped by
        ``interval``): a queued response's first piece opens it
        (``_begin``), then the piece's item events."""
        async for event in grouped(self.generation.events(), self.interval):
            opening = self._begin()
            yield opening + self.items.add(event.text, self._logprobs(event),
                                           last=event.finish_reason is not None)
            self.finish_reason = event.finish_reason or self.finish_reason

    def _begin(self) -> list[Event]:
        """At the engine's first output a queued (background) response is
        stored "in_progress" and its stream goes on with the opening
        events; nothing for one in progress (a foreground one opened at once)."""
        if self.status != "queued":
            return []
        self.status = "in_progress"
        self.save(self.shape.started(), self.conversation)
        return self._opening()

    def _opening(self) -> list[Event]:
        """``response.in_progress`` and the events before any text."""
        return [("response.in_progress", {"response": self.shape.started()}),
                *self.items.start()]

    def _logprobs(self, event: ChoiceEvent) -> list[dict]:
        """The logprobs of the event's answer tokens (the reasoning's and
        its end tag's are left out), where asked."""
        if self.num_top is None:
            return []
        start = 0 if self.answer is None else self.answer.answer_from(event.token_ids)
        if event.logprobs is None:
            return []
        return self.state.logprobs.chat(event.token_ids[start:], event.logprobs[start:],
                                        self.num_top)

    def save(self, body: dict, conversation: list[dict]) -> None:
        """Store ``body`` (where the store keeps it) with ``conversation``,
        the input items and the events."""
        if self.store is not None:
            self.store.put(body, conversation, self.input_items, self.log)

    def finish(self) -> tuple[list[Event], dict]:
        """The closing item events and the finished response, stored (where
        the store keeps it) with its conversation, its answer last, and its
        input items."""
        status = status_of(self.finish_reason)
        events = self.items.finish(status)
        body = self.shape.finished(self.items.items, status, self.generation.usage())
        self.save(body, [*self.conversation, *output_messages(body["output"])])
        self.status = status
        return events, body

    async def collect(self) -> dict:
        async for _ in self.steps():
            pass
        return self.finish()[1]

    async def events(self) -> AsyncIterator[str]:
        """The stream's events, as OpenAI sends them: ``response.created``
        and ``response.in_progress`` with the response "in_progress" (a
        background one's ``response.created`` and ``response.queued`` with
        it "queued", as it is stored, and ``response.in_progress`` at the
        engine's first output), each item's events, and
        the finished response, stored before its last event
        (``response.completed`` or ``response.incomplete``, as its status)
        is sent, so a client that has it finds it stored."""
        out = ResponseEvents()
        first = self.shape.started(self.status)
        yield out.event("response.created", response=first)
        later = ([("response.queued", {"response": first})] if self.status == "queued"
                 else self._opening())
        for kind, fields in later:
            yield out.event(kind, **fields)
        try:
            async for step in self.steps():
                for kind, fields in step:
                    yield out.event(kind, **fields)
            closing, body = self.finish()
        except Exception as e:  # the error event, by errors.error_answer's rule
            error = error_answer(e)[1]["error"]
            self.stopped = error["message"]
            code = error["code"] if isinstance(error["code"], str) else error["type"]
            yield out.error(self.stopped, code, error["param"])
            return
        for kind, fields in closing:
            yield out.event(kind, **fields)
        yield out.event(terminal_event(body["status"]), response=body)

    async def in_background(self) -> None:
        """A background response's task: generate it (each event of a
        stream into ``log``) and store it finished, or "failed" with the
        reason when it cannot finish. Cancelled, it stores nothing here;
        ``background_ended`` ends it, whether it ran or not."""
        try:
            if self.log is None:
                await self.collect()
            else:
                async for event in self.events():
                    self.log.append(event)
        except EngineStoppedError as e:
            self.stopped = e.client_message()
        except GenerationError as e:  # logged where raised
            self.stopped = str(e)
        except Exception:
            logger.exception("background response %s failed", self.shape.id)
            self.stopped = "the server failed to run this response"
        if self.status in RUNNING:
            self.status = "failed"
            self.save(self.shape.failed(self.stopped or "the response did not finish"),
                      self.conversation)

    def background_ended(self, _task: asyncio.Task) -> None:
        """The end of a background response's task, however it came
        (finished, failed, or cancelled, even before it ever ran): its
        engine requests are aborted and its log closed (a follower's stream
        ends), and its stored entry is final and counted with every logged
        event. An entry still stored running was cancelled by the server's
        shutdown (the cancel route stores it "cancelled" first, DELETE
        removes it): it is stored "cancelled"."""
        self.generation.abort_unfinished()
        if self.log is not None:
            self.log.close()
        found = None if self.store is None else self.store.get(self.shape.id)
        if found is None:
            return
        if found.running:
            self.store.put_cancelled(self.shape.id)
        else:  # a stream's last events came after its finished body was stored
            self.store.recount(self.shape.id)


def terminal_event(status: str) -> str:
    """The type of the event that ends a stream with a finished response."""
    return "response.incomplete" if status == "incomplete" else "response.completed"


def retrieve_response(state: ServerState, response_id: str, stream: bool,
                      starting_after: int | None) -> dict | Response:
    """``GET /v1/responses/{id}``: the stored response as it stands (a
    background one as its status last changed); with ``stream``, the
    events of a streamed background response after ``starting_after``
    (a sequence number; None: all), followed until it ends."""
    found = stored(state.response_store, response_id, None)
    if not stream:
        return found.body
    if found.events is None:
        raise FieldError("stream", f"Response with id {response_id!r} was not created with "
                                   "background and stream both true: only such a response's "
                                   "events are kept to be streamed again")
    if starting_after is not None and starting_after < 0:
        raise FieldError("starting_after", f"starting_after must be a sequence number, at "
                                           f"least 0, got {starting_after}")
    return followed_stream(found.events.follow(starting_after))


async def delete_response(state: ServerState, response_id: str) -> dict:
    """``DELETE /v1/responses/{id}``: the stored response is removed; a
    background one still running is cancelled first."""
    stored(state.response_store, response_id, None)
    state.response_store.delete(response_id)
    await state.background.cancel(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def list_input_items(state: ServerState, response_id: str, params: Mapping[str, str],
                     include: list[str]) -> dict:
    """``GET /v1/responses/{id}/input_items``: a page of the stored
    response's input items (``responses_input_items.read_query``'s query)."""
    found = stored(state.response_store, response_id, None)
    return items_page(found.input_items, read_query(params, include))


async def cancel_response(state: ServerState, response_id: str) -> dict:
    """``POST /v1/responses/{id}/cancel``: a background response still
    queued or in progress is stored "cancelled" and its task cancelled,
    which aborts its engine requests; the answer is the cancelled
    response, once they are. As vLLM's, any other response is a 400: one
    not run in the background, or one that has finished (a cancelled one
    too)."""
    found = stored(state.response_store, response_id, None)
    if not found.body["background"]:
        raise InvalidRequestError(f"Response with id {response_id!r} was not created with "
                                  "background: true and cannot be cancelled: only a "
                                  "background response can be")
    if not found.running:
        raise InvalidRequestError(f"Response with id {response_id!r} has already finished "
                                  f"(status {found.body['status']!r}) and cannot be cancelled")
    cancelled = state.response_store.put_cancelled(response_id)
    await state.background.cancel(response_id)
    return cancelled
