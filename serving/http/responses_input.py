"""A Responses request in the chat's terms: its ``input`` items as chat
messages, its flat function ``tools`` as the chat's tools, its
``tool_choice`` as the chat route's ``ToolChoice``, and the whole as the
``ChatCompletionRequest`` it amounts to.

Items, as vLLM reads them: a message is the chat message of its role (its
text parts joined as the chat joins them); a ``function_call`` is an
assistant's tool call whose id is its ``call_id``, added to the assistant
message just before it (the text an answer gave with its calls, or calls
before it) or else to an assistant message of its own, without content; a
``function_call_output`` is the "tool" message answering ``call_id``; a
``reasoning`` item (a reasoning model's thinking, as this server's answers
hold it) is an assistant message with that text in vLLM's ``reasoning``
field, to which the assistant message or call that follows it is added
(its ``reasoning_text`` parts joined, else its summary's texts;
``encrypted_content`` is refused, as vLLM refuses it). A
finished response's own output items read the same way (``output_messages``),
which is how the response store keeps a conversation whose answer made calls;
a call of its own cut at ``max_output_tokens`` (arguments that are no JSON
text) was never made and is left out, as a client's such call is refused.

Tools: ``{"type": "function", "name", ...}`` is the chat's ``{"type":
"function", "function": {"name", ...}}``, its other fields as given; no
tools (or ``[]``) is none. ``tool_choice`` "none", "auto" (without tools:
"none"), "required" or ``{"type": "function", "name": X}`` mean what the
chat's do (``tools.resolve_tool_choice``), and a bad one is refused naming
this API's fields.
"""

from __future__ import annotations

import json

from serving.http.protocol import (
    ChatCompletionRequest,
    ChatTool,
    FieldError,
    FunctionDefinition,
    ResponseInputItem,
    ResponsesRequest,
    ResponseTool,
)
from serving.http.tools import (
    MODES,
    ToolCallReader,
    ToolChoice,
    ToolSpelling,
    resolve_tool_choice,
    shown_choice,
)

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
RESPONSES_SPELLING = ToolSpelling("tools.{i}.name", "tool_choice.name",
                                  '{"type": "function", "name": ...}')


def input_messages(given: str | list[ResponseInputItem], own: bool = False) -> list[dict]:
    """The request's ``input`` as chat messages; ``FieldError`` naming the
    first item or part this server does not serve. ``own``: items this
    server made, where a call whose arguments are no JSON text (cut at
    ``max_output_tokens``) is left out rather than refused."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    messages: list[dict] = []
    for i, item in enumerate(given):
        where = f"input.{i}"
        if item.type == "message":
            _add_message(_message(where, item), messages)
        elif item.type == "function_call":
            _add_call(where, item, messages, own)
        elif item.type == "function_call_output":
            messages.append(_call_output(where, item))
        elif item.type == "reasoning":
            messages.append({"role": "assistant", "content": "",
                             "reasoning": _reasoning_text(where, item)})
        else:
            raise FieldError(f"{where}.type", f"input items of type {item.type!r} are not "
                                              f"supported by this server (only "
                                              f"{', '.join(ITEM_TYPES)})")
    return messages


def output_messages(output: list[dict]) -> list[dict]:
    """A finished response's output items as the chat messages they are."""
    return input_messages([ResponseInputItem.model_validate(item) for item in output], own=True)


def _add_message(message: dict, messages: list[dict]) -> None:
    """An assistant message right after a reasoning item's gives it its
    content; any other message comes on its own."""
    last = messages[-1] if messages else None
    if (message["role"] == "assistant" and last is not None and last.keys() == {
            "role", "content", "reasoning"} and last["role"] == "assistant"
            and last["content"] == ""):
        last["content"] = message["content"]
    else:
        messages.append(message)


def _reasoning_text(where: str, item: ResponseInputItem) -> str:
    extra = item.model_extra or {}
    if extra.get("encrypted_content") is not None:
        raise FieldError(f"{where}.encrypted_content", f"{where} holds encrypted_content: "
                                                        "encrypted reasoning is not supported by "
                                                        "this server")
    summary = extra.get("summary") or []
    if not isinstance(summary, list):
        raise FieldError(f"{where}.summary", f"{where}.summary must be a list of parts")
    summary = [_part_text(f"{where}.summary.{j}", part, "summary_text")
               for j, part in enumerate(summary)]
    if isinstance(item.content, str):
        return item.content
    if item.content:
        return "".join(_part_text(f"{where}.content.{j}", part.model_dump(), "reasoning_text")
                       for j, part in enumerate(item.content))
    return "\n".join(summary)


def _part_text(where: str, part, kind: str) -> str:
    """The text of a part of type ``kind`` (a dict as sent)."""
    if not (isinstance(part, dict) and part.get("type") == kind
            and isinstance(part.get("text"), str)):
        raise FieldError(where, f"{where} must be a {kind} part with a text")
    return part["text"]


def _message(where: str, item: ResponseInputItem) -> dict:
    if item.role not in ROLES:
        raise FieldError(f"{where}.role", f"{where}.role must be one of "
                                          f"{', '.join(ROLES)}, got {item.role!r}")
    if item.content is None:
        raise FieldError(f"{where}.content", f"{where} needs a content")
    return {"role": item.role, "content": _text(f"{where}.content", item.content)}


def _text(where: str, content: str | list) -> str | list[dict]:
    """A text, or a list of parts as the chat's text parts."""
    if isinstance(content, str):
        return content
    return [_text_part(f"{where}.{j}", part) for j, part in enumerate(content)]


def _text_part(where: str, part) -> dict:
    if part.type not in TEXT_PARTS:
        raise FieldError(f"{where}.type", f"content parts of type {part.type!r} are not "
                                          "supported by this server (only input_text and "
                                          "output_text)")
    if part.text is None:
        raise FieldError(f"{where}.text", f"{where} needs a text")
    return {"type": "text", "text": part.text}


def _add_call(where: str, item: ResponseInputItem, messages: list[dict], own: bool) -> None:
    for name in ("call_id", "name", "arguments"):
        if getattr(item, name) is None:
            raise FieldError(f"{where}.{name}", f"{where}, a function_call item, needs its {name}")
    if item.arguments.strip():
        try:
            json.loads(item.arguments)
        except ValueError as e:
            if own:  # the chat takes no such call, and the model never finished it
                return
            raise FieldError(f"{where}.arguments",
                             f"{where}.arguments must be JSON text ({e})") from None
    call = {"id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": item.arguments}}
    if messages and messages[-1]["role"] == "assistant":
        messages[-1].setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(where: str, item: ResponseInputItem) -> dict:
    for name in ("call_id", "output"):
        if getattr(item, name) is None:
            raise FieldError(f"{where}.{name}",
                             f"{where}, a function_call_output item, needs its {name}")
    return {"role": "tool", "tool_call_id": item.call_id,
            "content": _text(f"{where}.output", item.output)}


def instruction_messages(request: ResponsesRequest) -> list[dict]:
    return [{"role": "system", "content": request.instructions}] if request.instructions else []


def chat_tools(tools: list[ResponseTool] | None) -> list[ChatTool] | None:
    """The request's function tools as the chat's (None: no tools)."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise FieldError(f"tools.{i}.type", f"tools of type {tool.type!r} are not supported "
                                                "by this server (only function tools)")
        if tool.name is None:
            raise FieldError(f"tools.{i}.name", f"tools.{i}, a function tool, needs a name")
        function = {k: v for k, v in tool.model_dump(exclude_unset=True).items() if k != "type"}
        out.append(ChatTool(type="function", function=FunctionDefinition.model_validate(function)))
    return out


def chat_request(request: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    """The chat request a Responses request amounts to (its constraint
    aside: ``text.format`` is given to ``choice_params`` as made there; its
    tool choice is ``tool_choice``'s); ``reasoning.effort`` is its
    ``reasoning_effort`` and vLLM's ``chat_template_kwargs`` its own, so the
    chat's rules (``template_kwargs``, ``request_template``) are the ones
    that render them."""
    return ChatCompletionRequest(
        messages=messages, model=request.model, max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
        seed=request.seed, stop=request.stop, ignore_eos=request.ignore_eos,
        repetition_penalty=request.repetition_penalty, priority=request.priority,
        logit_bias=request.logit_bias, skip_special_tokens=request.skip_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        structured_outputs=request.structured_outputs, tools=chat_tools(request.tools),
        parallel_tool_calls=request.parallel_tool_calls,
        cache_salt=request.cache_salt, chat_template_kwargs=request.chat_template_kwargs,
        reasoning_effort=request.reasoning.effort if request.reasoning else None)


def tool_choice(request: ResponsesRequest, chat: ChatCompletionRequest,
                parser: type[ToolCallReader] | None) -> ToolChoice:
    """The request's tool choice, read as the chat route reads its own
    (``chat``: ``chat_request``'s; ``parser``: the server's "auto" reader)."""
    choice = request.tool_choice
    if choice is None or choice in MODES:
        mode = "none" if choice == "auto" and chat.tools is None else choice
        return resolve_tool_choice(chat, mode, None, parser, RESPONSES_SPELLING,
                                   shown_choice(choice))
    return resolve_tool_choice(chat, "named", _named_function(choice), parser,
                               RESPONSES_SPELLING, shown_choice(choice))


def _named_function(choice) -> str:
    if isinstance(choice, str):
        raise FieldError("tool_choice", f'tool_choice must be "none", "auto", "required" or '
                                        f"{RESPONSES_SPELLING.named_usage}, got {choice!r}")
    if choice.get("type") != "function":
        raise FieldError("tool_choice.type", f"tool_choice of type {choice.get('type')!r} is "
                                             "not supported by this server (only function "
                                             f"tools: {RESPONSES_SPELLING.named_usage})")
    name = choice.get("name")
    if not isinstance(name, str) or not name:
        raise FieldError("tool_choice.name", "a named tool_choice needs the function's name: "
                                             f"{RESPONSES_SPELLING.named_usage}")
    return name
