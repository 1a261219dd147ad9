"""POST /v1/chat/completions: messages in, the assistant's message out
(whole, or as server-sent ``chat.completion.chunk`` events).

The prompt is the model's chat template (or the request's own, where the
server trusts it: ``request_template.py``) rendered over the messages and
tokenized (``checkpoint.chat_template.chat_prompt_ids``), with vLLM's
``documents`` and ``reasoning_effort`` among the template's variables
(``template_kwargs``), the tokenizer's special tokens added with vLLM's
``add_special_tokens``, and the rendered text in the answer's
``prompt_text`` with vLLM's ``return_prompt_text`` (streamed: on each
choice's role chunk).
``max_completion_tokens`` (or the older ``max_tokens``) defaults to what
the context has left (None: the engine sets it, ``LLMEngine.new_request``).
With a tool choice other than "none" (``tools.py``) each choice's text is
read into ``tool_calls`` (and, for "auto", content) by its own
``ToolCallReader``, whole or as it streams. With a reasoning parser
(``--reasoning-parser``) each choice's reasoning is split off first
(``answer_reader.Reading``): the message's ``reasoning`` (vLLM's field)
holds it, and its stream's deltas carry it in ``reasoning`` until the
reasoning ends, then ``content``; only the content is read for calls.
vLLM's ``include_reasoning`` false leaves the reasoning out, and the
logprobs with it. The answer's role is
``answer_role``'s; with vLLM's ``echo`` each choice's content starts with
``chat_echo``'s text: whole, before the content (also of a message whose
text became tool calls, as vLLM's); streamed, as each choice's first
content delta, right after its role. With vLLM's ``return_token_ids``
the answer has ``prompt_token_ids`` at its top (streamed: on each choice's
role chunk) and each choice its raw output's ``token_ids`` (streamed: each
chunk its own, a chunk for ids whose text a reader holds back or drops),
unless it hides its reasoning (``serving.http.token_ids``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from checkpoint.chat_template import chat_prompt_ids
from engine.reasoning import enable_thinking_of
from engine.sampling_params import truncated_prompt
from engine.tool_depth import check_tool_depth
from ipc.messages import WHOLE_VOCAB
from serving.http.answer_reader import Reading, ReasonedReader
from serving.http.beam_search import check_beam_fields, respond_with_beams
from serving.http.echo import answer_role, chat_echo
from serving.http.generation import ChoiceEvent, Generation
from serving.http.protocol import ChatCompletionRequest, FieldError
from serving.http.request_template import request_template, template_variables
from serving.http.response_ids import response_id
from serving.http.sampling import capped_max_tokens, check_logprobs, choice_params
from serving.http.state import ServerState
from serving.http.stream_interval import grouped, interval_of
from serving.http.streaming import event_lines, respond
from serving.http.token_ids import ReturnedTokenIds
from serving.http.tools import ToolCallReader, ToolChoice, rendered_tools, tool_choice_of

AnswerReader = ToolCallReader | ReasonedReader


def template_kwargs(request: ChatCompletionRequest) -> dict[str, Any]:
    """The chat template's variables beside the messages, as vLLM gives
    them: ``chat_template_kwargs``' (``template_variables``), over which the
    request's ``documents`` and ``reasoning_effort`` go where set, and, with
    ``reasoning_effort``, ``enable_thinking`` (false for "none") unless the
    kwargs set it: a template that thinks only when asked (Qwen3's) then
    does as the effort says, and a reasoning parser reads the answer so."""
    kwargs = template_variables(request.chat_template_kwargs)
    for name in ("documents", "reasoning_effort"):
        if getattr(request, name) is not None:
            kwargs[name] = getattr(request, name)
    if request.reasoning_effort is not None:
        kwargs.setdefault("enable_thinking", request.reasoning_effort != "none")
    return kwargs


def rendered_prompt(state: ServerState, request: ChatCompletionRequest) -> tuple[str, list[int]]:
    """The prompt's text (the template rendered) and its token ids."""
    template = request_template(request.chat_template, request.chat_template_kwargs,
                                state.trust_request_chat_template, state.chat_template)
    messages = [m.model_dump(exclude_none=True) for m in request.messages]
    return chat_prompt_ids(state.tokenizer, messages, chat_template=template,
                           add_generation_prompt=request.add_generation_prompt,
                           extra=template_kwargs(request),
                           continue_final_message=request.continue_final_message,
                           tools=rendered_tools(request),
                           add_special_tokens=request.add_special_tokens)


def chat_prompt(state: ServerState, request: ChatCompletionRequest) -> list[int]:
    return rendered_prompt(state, request)[1]


def _num_top(request: ChatCompletionRequest) -> int | None:
    """The top logprobs each token computes: None where the request gives
    ``logprob_token_ids`` (their number is the count, vLLM's rule)."""
    if not request.logprobs:
        if request.top_logprobs:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
        request.listed_logprobs(False, "logprobs: true")
        return None
    if request.logprob_token_ids:
        return None
    return request.top_logprobs or 0


async def create_chat_completion(state: ServerState, request: ChatCompletionRequest,
                                 raw: Request) -> Response:
    state.check_model(request.model)
    request.check_supported()
    if request.use_beam_search:
        check_beam_fields(request, "messages", also=("echo",))
    check_tool_depth(rendered_tools(request))  # before anything walks them
    tool_choice = tool_choice_of(request, state.tool_call_parser)
    check_logprobs(state.max_logprobs, state.vocab_size, top_logprobs=_num_top(request),
                   prompt_logprobs=request.prompt_logprobs)
    # Off the event loop: rendering and tokenizing a long chat takes a while.
    text, prompt = await asyncio.to_thread(rendered_prompt, state, request)
    # As the engine will see it (the engine's rule: a 400 naming the field
    # for more than max_model_len), so its room below is the room it has.
    prompt = truncated_prompt(prompt, request.truncate_prompt_tokens, state.max_model_len,
                              request.truncation_side)
    max_tokens = (request.max_completion_tokens if request.max_completion_tokens is not None
                  else request.max_tokens)
    max_tokens = capped_max_tokens(max_tokens, state.sampling_defaults,
                                   state.max_model_len - len(prompt))
    if request.use_beam_search:
        # A max_tokens given is checked as given (0 is a 400, as without
        # beam search); a prompt that leaves no room is BeamSearch's 400.
        steps = (max_tokens if max_tokens is not None
                 else max(1, state.max_model_len - len(prompt)))
        role = answer_role(request, state.response_role)
        echo = chat_echo(request, role)
        reading = reading_of(state, request, ToolChoice("none"))
        head = _head(state, request, response_id("chatcmpl-", raw, request), "chat.completion")
        shows_ids = request.return_token_ids and not reading.hides_reasoning
        if request.return_token_ids:
            head["prompt_token_ids"] = prompt
        return await respond_with_beams(
            state, raw, request, [prompt], steps, head,
            lambda p, text, tokens, in_reasoning: {
                "message": _whole_message(text, reading.reader(in_reasoning), role, echo),
                "logprobs": None, **({"token_ids": tokens} if shows_ids else {})},
            enable_thinking=enable_thinking(request))
    params = choice_params(request, max_tokens, _num_top(request),
                           constraint=tool_choice.constraint(), defaults=state.sampling_defaults,
                           skip_special_tokens=tool_choice.skip_special_tokens(
                               request.skip_special_tokens))
    reading = reading_of(state, request, tool_choice)
    generation = Generation(state.link, state.metrics, count_reasoning=reading.reasoning_count)
    await generation.start([prompt], params, request.stop_strings(), request.priority,
                           enable_thinking=enable_thinking(request),
                           cache_salt=request.cache_salt,
                           lora_request=state.lora_request(request.model))
    answer_id = response_id("chatcmpl-", raw, request)
    shown_text = text if request.return_prompt_text else None
    return await respond(raw, generation, request.stream,
                         lambda: _stream(state, request, generation, answer_id, reading,
                                         shown_text),
                         lambda: _collect(state, request, generation, answer_id, reading,
                                          shown_text))


def reading_of(state: ServerState, request: ChatCompletionRequest,
               tool_choice: ToolChoice) -> Reading:
    """How the request's answers are read (where each output begins is the
    engine's word, with its acceptance)."""
    parser = state.reasoning_parser
    if parser is None:
        return Reading(tool_choice)
    return Reading(tool_choice, parser, request.include_reasoning)


def enable_thinking(request: ChatCompletionRequest) -> bool:
    """The request's ``enable_thinking``, as its template reads it
    (``template_kwargs``), for the engine to decide where its output begins."""
    return enable_thinking_of(template_kwargs(request))


def _head(state: ServerState, request: ChatCompletionRequest, answer_id: str,
          obj: str) -> dict:
    return {"id": answer_id, "object": obj, "created": int(time.time()),
            "model": state.shown_model(request.model)}


def _shown_top(request: ChatCompletionRequest, reading: Reading) -> int | None:
    """The top logprobs an answer shows per token (None: no logprobs; with
    ``logprob_token_ids``, all the engine sent, as vLLM shows them)."""
    if reading.hides_reasoning:
        return None
    return WHOLE_VOCAB if request.logprob_token_ids else _num_top(request)


def _logprobs(state: ServerState, request: ChatCompletionRequest, event: ChoiceEvent,
              num_top: int | None) -> list | None:
    if num_top is None or event.logprobs is None:
        return None
    return state.logprobs.chat(event.token_ids, event.logprobs, num_top,
                               request.return_tokens_as_token_ids,
                               listed=bool(request.logprob_token_ids))


def _returned_ids(request: ChatCompletionRequest, generation: Generation,
                  reading: Reading) -> ReturnedTokenIds:
    """The answer's ids: as vLLM's, an answer that hides its reasoning
    shows its prompt's ids but none of its own (they would show it)."""
    return ReturnedTokenIds(generation, prompts=request.return_token_ids,
                            outputs=request.return_token_ids and not reading.hides_reasoning)


def _readers(reading: Reading, generation: Generation) -> list[AnswerReader | None]:
    """Each choice's reader, where the engine said its output begins."""
    return [reading.reader(generation.starts_in_reasoning(i))
            for i in range(len(generation.choices))]


def _message(text: str, reader: AnswerReader | None, role: str, echo: str | None) -> dict:
    """A whole answer's message: its text, or what its reader made of it
    (no calls, no ``tool_calls``), its content after ``echo`` where echoing."""
    message = {"role": role, "content": text} if reader is None else {"role": role,
                                                                       **reader.message()}
    if echo is not None:
        message["content"] = echo + (message["content"] or "")
    return message


def _whole_message(text: str, reader: AnswerReader | None, role: str, echo: str | None) -> dict:
    """``_message`` of a text that came whole (a beam's)."""
    if reader is not None:
        reader.pieces(text, last=True)
    return _message(text, reader, role, echo)


async def _collect(state: ServerState, request: ChatCompletionRequest, generation: Generation,
                   answer_id: str, reading: Reading, prompt_text: str | None) -> dict:
    num_top = _shown_top(request, reading)
    n = len(generation.choices)
    readers = _readers(reading, generation)
    ids = _returned_ids(request, generation, reading)
    texts: list[list[str]] = [[] for _ in range(n)]  # each choice's pieces, joined once
    reasons, stop_reasons = [None] * n, [None] * n
    logprobs: list[list] = [[] for _ in range(n)]
    prompt_logprobs = None
    async for event in generation.events():
        if event.prompt_logprobs is not None and request.prompt_logprobs is not None:
            prompt_logprobs = state.logprobs.prompt_logprobs(
                prompt_token_ids(generation), event.prompt_logprobs, request.prompt_logprobs)
        texts[event.index].append(event.text)
        ids.add(event)
        reader = readers[event.index]
        if reader is not None:
            reader.delta(event.text, last=event.finish_reason is not None)
        if event.finish_reason is not None:
            reasons[event.index] = (event.finish_reason if reader is None
                                    else reader.finish_reason(event.finish_reason))
            stop_reasons[event.index] = event.stop_reason
        logprobs[event.index] += _logprobs(state, request, event, num_top) or []
    role = answer_role(request, state.response_role)
    echo = chat_echo(request, role)
    choices = [{"index": i, "message": _message("".join(texts[i]), readers[i], role, echo),
                "logprobs": {"content": logprobs[i]} if num_top is not None else None,
                "finish_reason": reasons[i], "stop_reason": stop_reasons[i]}
               for i in range(n)]
    if ids.outputs:
        for i, choice in enumerate(choices):
            choice["token_ids"] = ids.of_choice(i)
    body = {**_head(state, request, answer_id, "chat.completion"), "choices": choices,
            "usage": generation.usage()}
    if request.prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs  # vLLM's place for them in a chat answer
    if ids.prompts:
        body["prompt_token_ids"] = ids.prompt_of(0)
    if prompt_text is not None:
        body["prompt_text"] = prompt_text
    return body


def prompt_token_ids(generation: Generation) -> list[int]:
    """The one prompt of a chat request."""
    return next(iter(generation.choices.values())).prompt_token_ids


def _stream(state: ServerState, request: ChatCompletionRequest, generation: Generation,
            answer_id: str, reading: Reading, prompt_text: str | None) -> AsyncIterator[str]:
    head = _head(state, request, answer_id, "chat.completion.chunk")
    return event_lines(_chunks(state, request, generation, head, reading, prompt_text), head,
                       generation, request.include_usage, request.continuous_usage)


def _delta(text: str, reader: AnswerReader | None, last: bool) -> dict:
    """A stream's delta for new text: the text, or what its reader lets out
    (nothing yet: an empty delta)."""
    if reader is None:
        return {"content": text} if text else {}
    return reader.delta(text, last)


async def _chunks(state: ServerState, request: ChatCompletionRequest, generation: Generation,
                  head: dict, reading: Reading, prompt_text: str | None) -> AsyncIterator[dict]:
    num_top = _shown_top(request, reading)
    readers = _readers(reading, generation)
    ids = _returned_ids(request, generation, reading)
    role = answer_role(request, state.response_role)
    opening = []
    for index in range(len(generation.choices)):
        choice = {"index": index, "delta": {"role": role, "content": ""},
                  "logprobs": None, "finish_reason": None}
        chunk = {**head, "choices": [choice]}
        if (prompt := ids.first_prompt_of(index)) is not None:
            chunk["prompt_token_ids"] = prompt
        if prompt_text is not None:
            chunk["prompt_text"] = prompt_text
        opening.append(chunk)
    echo = chat_echo(request, role)
    if echo:
        for index in range(len(generation.choices)):
            choice = {"index": index, "delta": {"content": echo}, "logprobs": None,
                      "finish_reason": None}
            opening.append({**head, "choices": [choice]})
    async for event in grouped(generation.events(),
                                 interval_of(state.stream_interval, request.stream_interval)):
        # The role (and echo) chunks go out with the first output, as
        # vLLM's: a client's time to the first chunk is its time to the
        # first token, not to the request's acceptance.
        for chunk in opening:
            yield chunk
        opening = []
        lp = _logprobs(state, request, event, num_top)
        reader = readers[event.index]
        delta = _delta(event.text, reader, last=event.finish_reason is not None)
        if (not delta and lp is None and event.finish_reason is None
                and not ids.needs_chunk(event)):
            continue  # text held back (an incomplete character, a call not yet whole)
        reason = event.finish_reason
        if reader is not None and reason is not None:
            reason = reader.finish_reason(reason)
        choice = {"index": event.index, "delta": delta,
                  "logprobs": {"content": lp} if lp is not None else None,
                  "finish_reason": reason, "stop_reason": event.stop_reason,
                  **ids.chunk_fields(event)}
        yield {**head, "choices": [choice]}
    for chunk in opening:  # an answer without any output
        yield chunk
