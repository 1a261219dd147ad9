"""What a Responses API answer looks like: the ``Response`` object, its
output items, and the server-sent events of a stream.

``ResponseShape`` holds what every form of one response shares (its id,
its creation time, the request fields it echoes) and builds the object in
each state: ``in_progress`` (a background one first ``queued``) with no
output yet, then finished with its output items
(``responses_items.OutputItems``). A finished response is ``completed``,
or ``incomplete`` with ``incomplete_details.reason`` "max_output_tokens"
when the engine stopped it for length (a background one may also end
``failed``, with an ``error``, or ``cancelled``); its ``usage``
counts ``input_tokens`` (cached ones in ``input_tokens_details``, which
also has the ``cache_write_tokens`` OpenAI's types require: 0),
``output_tokens`` and ``total_tokens``.

Output items, as OpenAI's types define them: a ``reasoning`` item (id
``rs_<hex>``, a reasoning model's thinking as one ``reasoning_text`` part,
no ``summary``); an assistant ``message`` (id
``msg_<hex>``) holding one ``output_text`` part, whose ``logprobs`` are
its tokens' (``{"token", "logprob", "bytes", "top_logprobs"}``, the
chat's entries) where the request asked for them, else empty; a
``function_call`` (id ``fc_<hex>``, ``call_id`` ``call_<hex>``, ``name``,
``arguments`` JSON text). A stream's text events carry logprobs in their
own shape, without bytes (``event_logprobs``).

``ResponseEvents`` numbers a stream's events (``sequence_number`` from 0)
and writes each as OpenAI sends it: an ``event:`` line naming the type,
then the ``data:`` line.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field

_ENCODER = json.JSONEncoder(ensure_ascii=False)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def response_usage(usage: dict) -> dict:
    """``Generation.usage()`` in the Responses API's terms: prefix-cache hits
    are ``cached_tokens``; ``cache_write_tokens`` (OpenAI's count of tokens
    written to its retained prompt cache, a field its types require) is 0,
    as this server keeps no such cache; ``reasoning_tokens`` are a
    reasoning parser's count (0 without one)."""
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {
                "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": usage.get(
                "completion_tokens_details", {}).get("reasoning_tokens", 0)},
            "total_tokens": usage["total_tokens"]}


def status_of(finish_reason: str | None) -> str:
    """A finished response's status: "incomplete" when it ran out of tokens."""
    return "incomplete" if finish_reason == "length" else "completed"


@dataclass
class ResponseShape:
    """``echo``: the request fields the Response repeats (model, instructions,
    the sampling values it ran with, ...)."""

    echo: dict
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict], usage: dict | None) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "error": None, "incomplete_details": incomplete,
                "output": output, "usage": usage, **self.echo}

    def started(self, status: str = "in_progress") -> dict:
        """The response before any output ("queued": a background one not
        yet running)."""
        return self.body(status, [], None)

    def failed(self, message: str) -> dict:
        """A background response that could not finish (OpenAI's
        ``error``, code "server_error")."""
        return {**self.body("failed", [], None),
                "error": {"code": "server_error", "message": message}}

    def finished(self, output: list[dict], status: str, usage: dict) -> dict:
        body = self.body(status, output, response_usage(usage))
        if status == "completed":
            body["completed_at"] = int(time.time())
        return body


def message_item(item_id: str, status: str, parts: list[dict]) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": parts}


def output_text(text: str, logprobs: list[dict] | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [],
            "logprobs": [] if logprobs is None else logprobs}


def reasoning_item(item_id: str, status: str, text: str | None) -> dict:
    """A reasoning item: its text as one ``reasoning_text`` part (None: no
    content yet, as a stream's first event shows it), no summary."""
    item = {"id": item_id, "type": "reasoning", "summary": [], "status": status}
    if text is not None:
        item["content"] = [reasoning_text(text)]
    return item


def reasoning_text(text: str) -> dict:
    return {"type": "reasoning_text", "text": text}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str) -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def event_logprobs(entries: list[dict]) -> list[dict]:
    """Logprob entries (an output text's) in a text event's shape: token and
    logprob, for the token and each of its top alternatives."""
    return [{"token": e["token"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]}
                              for t in e["top_logprobs"]]} for e in entries]


@dataclass
class ResponseEvents:
    sequence_number: int = 0

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {_ENCODER.encode(payload)}\n\n"

    def error(self, message: str, code: str, param: str | None = None) -> str:
        """The event that ends a stream the server could not finish."""
        return self.event("error", code=code, message=message, param=param)
