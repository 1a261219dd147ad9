"""A chat's prompt: a chat template (the model's, the server's
``--chat-template`` or a request's own) rendered with jinja2, as
transformers renders it.

The template runs in jinja2's immutable sandbox (a template cannot reach
Python objects' internals or change its inputs) with ``trim_blocks`` and
``lstrip_blocks``, the ``raise_exception`` function, a ``tojson`` filter
that keeps non-ASCII characters, and ``strftime_now``. Variables:
``messages`` (dicts with "role" and "content" as text, and what else each
message carries: an assistant's ``tool_calls``, a tool answer's
``tool_call_id``), ``tools`` (the list of tool dicts, or None, as
transformers passes them), ``add_generation_prompt``, ``bos_token`` and
``eos_token`` (the tokens' text), plus any ``chat_template_kwargs``. A
template that does not compile, a template error or ``raise_exception``
becomes ``ChatTemplateError``, and a message this module cannot read an
``InvalidRequestError`` (the base of ``ChatTemplateError``; a
``ValueError``): the request was bad (a template a request brings is the
request's, and the sandbox keeps it from reaching anything but its
variables).

``chat_prompt_ids`` is a chat's prompt for the engine, the one rendering
that ``LLM.chat`` and the HTTP server's /v1/chat/completions share.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ipc.errors import InvalidRequestError


class ChatTemplateError(InvalidRequestError):
    """The template refused the messages, or could not be rendered."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e}") from None


def message_text(content: str | list[dict] | None) -> str:
    """A message's content as text: the "text" parts of a list, joined."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise InvalidRequestError(
                f"only text content parts are supported, got {part.get('type')!r}")
        if not isinstance(part.get("text"), str):
            raise InvalidRequestError("a text content part needs a 'text' string")
        texts.append(part["text"])
    return "\n".join(texts)


def template_message(message: dict) -> dict:
    """``message`` as templates read it (a copy): its content as text and,
    in an assistant's ``tool_calls``, each call's ``arguments`` as the object
    its JSON text holds (transformers' convention for tool-use templates,
    which vLLM follows too: an empty text is ``{}``); an empty ``tool_calls``
    list is dropped, so the template takes its plain assistant path."""
    out = {**message, "content": message_text(message.get("content"))}
    calls = out.get("tool_calls")
    if calls is None:
        return out
    if not calls:
        del out["tool_calls"]
        return out
    out["tool_calls"] = [_call_with_object_arguments(call) for call in calls]
    return out


def _call_with_object_arguments(call: dict) -> dict:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ChatTemplateError('a tool call is {"type": "function", "function": '
                                '{"name": ..., "arguments": ...}}')
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments) if arguments.strip() else {}
        except ValueError as e:
            raise ChatTemplateError(f"a tool call's arguments are not JSON text ({e})") from None
    elif arguments is None:
        function["arguments"] = {}
    return {**call, "function": function}


# Appended to the final message's text with ``continue_final_message``, to
# find where that text ends once rendered (a word no template writes).
_FINAL_MARK = "TPRUN_FINAL_MESSAGE_ENDS_HERE "


def render_chat(template: str | None, messages: list[dict], *, add_generation_prompt: bool,
                bos_token: str | None, eos_token: str | None,
                extra: dict[str, Any] | None = None,
                continue_final_message: bool = False,
                tools: list[dict] | None = None) -> str:
    """The prompt text for ``messages`` (each with "role" and text "content")
    and ``tools`` (the template's ``tools``: None when there are none).

    ``continue_final_message`` (vLLM's and transformers'): the text ends
    where the final message's text ends, left open for the model to go on
    (an assistant's answer begun by the caller), cut as transformers cuts
    it: the template renders the final text with a mark after it, and the
    text ends before the mark (and, where the template trimmed what
    followed the final text, without that text's trailing spaces)."""
    if template is None:
        raise ChatTemplateError("the model has no chat template: give a plain prompt "
                                "(/v1/completions, LLM.generate)")
    if not messages:
        raise ChatTemplateError("messages must not be empty")
    if continue_final_message:
        if add_generation_prompt:
            raise ChatTemplateError("continue_final_message and add_generation_prompt "
                                    "cannot both be set")
        messages = [*messages[:-1], {**messages[-1],
                                     "content": messages[-1]["content"] + _FINAL_MARK}]
    variables = dict(extra or {})
    variables.update(messages=messages, tools=tools,
                     add_generation_prompt=add_generation_prompt,
                     bos_token=bos_token or "", eos_token=eos_token or "")
    try:
        text = compile_template(template).render(**variables)
    except ChatTemplateError:
        raise
    except Exception as e:  # the template's own code failed (jinja2 or Python error)
        raise ChatTemplateError(f"the chat template failed on these messages: {e}") from None
    return _open_final_message(text) if continue_final_message else text


def _open_final_message(text: str) -> str:
    """``text`` cut where the final message's text ends (see ``render_chat``)."""
    mark = _FINAL_MARK.strip()
    at = text.rfind(mark)
    if at < 0:
        raise ChatTemplateError("continue_final_message is set, but the chat template does not "
                                "keep the final message's text")
    if text.startswith(_FINAL_MARK, at):
        return text[:at]
    return text[:at].rstrip()  # the template trimmed what followed: trailing spaces too


def chat_prompt_ids(tokenizer, messages: list[dict], *, add_generation_prompt: bool = True,
                    chat_template: str | None = None, extra: dict[str, Any] | None = None,
                    continue_final_message: bool = False,
                    tools: list[dict] | None = None,
                    add_special_tokens: bool = False) -> tuple[str, list[int]]:
    """(text, token ids) of the prompt for ``messages`` (dicts with "role"
    and "content", text or a list of text parts, as ``template_message``
    reads them) and ``tools`` (OpenAI's tool dicts, given to the template
    as they are): the model's template (or ``chat_template``) rendered, then
    tokenized without adding special tokens, as transformers'
    ``apply_chat_template(tokenize=True)`` does: the template itself places
    BOS where the model wants it (``add_special_tokens``, vLLM's field:
    the tokenizer adds its own too). ``continue_final_message``: see
    ``render_chat``."""
    messages = [template_message(m) for m in messages]
    text = render_chat(chat_template or tokenizer.chat_template, messages,
                       add_generation_prompt=add_generation_prompt,
                       bos_token=tokenizer.token_text(tokenizer.bos_token_id),
                       eos_token=tokenizer.token_text(tokenizer.eos_token_id), extra=extra,
                       continue_final_message=continue_final_message, tools=tools)
    if not text:
        raise InvalidRequestError("the chat template rendered an empty prompt")
    return text, tokenizer.encode(text, add_special_tokens=add_special_tokens)
