"""OpenAI's Responses API for text: ``POST /v1/responses``, and with the
response store on, ``GET /v1/responses/{id}`` and ``POST
/v1/responses/{id}/cancel``.

A request is served as the chat request it amounts to, through the chat
route's own steps: its ``input`` (a text: one user message; or message
items) after its ``instructions`` (a system message first) and, with
``previous_response_id``, after the stored conversation that response ended
(``response_store.py``) becomes ``messages``; the model's chat template
renders them (``serving_chat.chat_prompt``), ``max_output_tokens``,
``temperature``, ``top_p`` and vLLM's fields (its sampling ones,
``logit_bias``, ``skip_special_tokens``, ``include_stop_str_in_output``,
``structured_outputs``) become the chat's sampling parameters
(``sampling.py``, with the model's recommended defaults), and
``text.format`` (or vLLM's ``structured_outputs``, not both) the output's
structured-output constraint (``structured.text_format_constraint``). The answer is built by
``responses_output.py``, whole or streamed. What does not fit the model's
context is refused before the engine sees it (``check_context``), so the
error names this API's fields (``input``, ``max_output_tokens``), not the
chat's ``max_tokens``; an empty conversation names ``input``.

As vLLM's server: the store is off by default, and then a request's
``store`` (true unless the client says otherwise) is served without
storing; ``previous_response_id`` and the ``GET``/``cancel`` routes answer
404 for a response the server does not hold. Only a response run in the
background can be cancelled, and this server runs none: cancelling a
stored response is a 400.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from engine.request import ContextLengthError
from serving.http.generation import Generation
from serving.http.protocol import ChatCompletionRequest, FieldError, ResponsesRequest
from serving.http.response_store import ResponseStore, stored
from serving.http.responses_output import ResponseEvents, ResponseShape
from serving.http.sampling import capped_max_tokens, choice_params
from serving.http.serving_chat import chat_prompt
from serving.http.state import ServerState
from serving.http.streaming import respond
from serving.http.structured import text_format_constraint
from serving.protocol_core import EngineStoppedError

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")


async def create_response(state: ServerState, request: ResponsesRequest,
                          raw: Request) -> Response:
    state.check_model(request.model)
    request.check_supported()
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise FieldError("max_output_tokens", f"max_output_tokens must be at least 1, got "
                                              f"{request.max_output_tokens}")
    history = ([] if request.previous_response_id is None else
               stored(state.response_store, request.previous_response_id,
                      "previous_response_id").conversation)
    turn = input_messages(request.input)
    messages = [*instruction_messages(request), *history, *turn]
    if not messages:
        raise FieldError("input", "input must not be empty: give a text or at least one "
                                  "message (or instructions, or a previous_response_id)")
    chat = chat_request(request, messages)
    text_format = request.text.format if request.text else None
    if text_format is not None and request.structured_outputs is not None:
        raise FieldError("structured_outputs", "give text.format or structured_outputs, "
                                               "not both")
    constraint = text_format_constraint(text_format)  # None: chat's structured_outputs
    prompt = await asyncio.to_thread(chat_prompt, state, chat)  # off the event loop
    max_tokens = capped_max_tokens(chat.max_completion_tokens, state.sampling_defaults,
                                   state.max_model_len - len(prompt))
    check_context(request, len(prompt), max_tokens, state.max_model_len)
    params = choice_params(chat, max_tokens, None, constraint=constraint,
                           defaults=state.sampling_defaults)
    generation = Generation(state.link, state.metrics)
    await generation.start([prompt], params, chat.stop_strings(), request.priority)
    store = state.response_store if request.store else None
    shape = ResponseShape(_echo(state, request, params[0], store is not None))
    conversation = [*history, *turn]
    return await respond(raw, generation, bool(request.stream),
                         lambda: _events(generation, shape, store, conversation),
                         lambda: _collect(generation, shape, store, conversation))


class ContextLengthFieldError(FieldError):
    """The input, or the input plus ``max_output_tokens``, does not fit the
    model's context: OpenAI's code for it, with this API's field names."""

    code = ContextLengthError.code


def check_context(request: ResponsesRequest, num_input_tokens: int, max_tokens: int | None,
                  max_model_len: int) -> None:
    """The engine's context rule (``engine.request.check_request``) ahead
    of it, in this API's terms: the engine's message names ``max_tokens``,
    which a Responses request does not have. ``max_tokens``: what the
    engine would be sent (the request's, under the recommended cap)."""
    if num_input_tokens >= max_model_len:
        raise ContextLengthFieldError(
            "input", f"the input ({num_input_tokens} tokens) leaves no room for output in "
                     f"max_model_len {max_model_len}, this model's maximum context length")
    given = request.max_output_tokens
    if given is not None and max_tokens is not None and \
            num_input_tokens + max_tokens > max_model_len:
        raise ContextLengthFieldError(
            "max_output_tokens", f"input ({num_input_tokens} tokens) + max_output_tokens "
                                 f"({given}) = {num_input_tokens + given} exceeds max_model_len "
                                 f"{max_model_len}, this model's maximum context length")


def input_messages(given: str | list) -> list[dict]:
    """The request's ``input`` as chat messages; ``FieldError`` naming the
    first item or part this server does not serve."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    return [_message(f"input.{i}", item) for i, item in enumerate(given)]


def _message(where: str, item) -> dict:
    if item.type != "message":
        raise FieldError(f"{where}.type", f"input items of type {item.type!r} are not "
                                          "supported by this server (only messages)")
    if item.role not in ROLES:
        raise FieldError(f"{where}.role", f"{where}.role must be one of "
                                          f"{', '.join(ROLES)}, got {item.role!r}")
    if item.content is None:
        raise FieldError(f"{where}.content", f"{where} needs a content")
    if isinstance(item.content, str):
        return {"role": item.role, "content": item.content}
    return {"role": item.role,
            "content": [_text_part(f"{where}.content.{j}", part)
                        for j, part in enumerate(item.content)]}


def _text_part(where: str, part) -> dict:
    """A content part as the chat's text part (joined as chat joins them)."""
    if part.type not in TEXT_PARTS:
        raise FieldError(f"{where}.type", f"content parts of type {part.type!r} are not "
                                          "supported by this server (only input_text and "
                                          "output_text)")
    if part.text is None:
        raise FieldError(f"{where}.text", f"{where} needs a text")
    return {"type": "text", "text": part.text}


def instruction_messages(request: ResponsesRequest) -> list[dict]:
    return [{"role": "system", "content": request.instructions}] if request.instructions else []


def chat_request(request: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    """The chat request a Responses request amounts to (its constraint
    aside: ``text.format`` is given to ``choice_params`` as made here)."""
    return ChatCompletionRequest(
        messages=messages, model=request.model, max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
        seed=request.seed, stop=request.stop, ignore_eos=request.ignore_eos,
        repetition_penalty=request.repetition_penalty, priority=request.priority,
        logit_bias=request.logit_bias, skip_special_tokens=request.skip_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        structured_outputs=request.structured_outputs)


def _echo(state: ServerState, request: ResponsesRequest, params: dict, stored: bool) -> dict:
    """The request fields a Response repeats; temperature and top_p as the
    engine runs them (the request's, else the model's defaults)."""
    return {"model": state.shown_model(request.model), "instructions": request.instructions,
            "metadata": request.metadata, "max_output_tokens": request.max_output_tokens,
            "temperature": params["temperature"], "top_p": params["top_p"],
            "previous_response_id": request.previous_response_id,
            "text": request.text.model_dump(exclude_none=True) if request.text else
            {"format": {"type": "text"}},
            "tool_choice": request.tool_choice or "auto", "tools": [],
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "truncation": "disabled", "top_logprobs": 0, "reasoning": None,
            "background": False, "service_tier": request.service_tier or "auto",
            "store": stored, "user": request.user}


def _keep(store: ResponseStore | None, body: dict, conversation: list[dict]) -> None:
    """Store a finished response with its conversation, its answer last."""
    if store is not None:
        answer = body["output"][0]["content"][0]["text"]
        store.put(body, [*conversation, {"role": "assistant", "content": answer}])


async def _collect(generation: Generation, shape: ResponseShape, store: ResponseStore | None,
                   conversation: list[dict]) -> dict:
    text, reason = "", None
    async for event in generation.events():
        text += event.text
        reason = event.finish_reason or reason
    body = shape.finished(text, reason, generation.usage())
    _keep(store, body, conversation)
    return body


async def _events(generation: Generation, shape: ResponseShape, store: ResponseStore | None,
                  conversation: list[dict]) -> AsyncIterator[str]:
    """The stream's events; the response is stored before its last event
    is sent, so a client that has it finds it stored."""
    events = ResponseEvents(shape)
    for line in events.opening():
        yield line
    text, reason = "", None
    try:
        async for event in generation.events():
            if event.text:
                text += event.text
                yield events.delta(event.text)
            reason = event.finish_reason or reason
    except EngineStoppedError as e:
        yield events.error(e.client_message(), "service_unavailable")
        return
    body = shape.finished(text, reason, generation.usage())
    _keep(store, body, conversation)
    for line in events.closing(body):
        yield line


def retrieve_response(state: ServerState, response_id: str, stream: bool) -> dict:
    """``GET /v1/responses/{id}``: the stored response as it was answered."""
    if stream:
        raise FieldError("stream", "stream is not supported when retrieving a response: this "
                                   "server runs no response in the background")
    return stored(state.response_store, response_id, None).body


def cancel_response(state: ServerState, response_id: str) -> dict:
    """``POST /v1/responses/{id}/cancel``: only a background response can be
    cancelled, and every stored response here has finished."""
    stored(state.response_store, response_id, None)
    raise ValueError(f"Response with id {response_id!r} was not created with background: "
                     "true and cannot be cancelled (this server runs no response in the "
                     "background)")
