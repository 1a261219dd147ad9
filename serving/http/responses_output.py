"""What a Responses API answer looks like: the ``Response`` object, whole or
as the server-sent events of a stream.

``ResponseShape`` holds what every form of one response shares (its ids,
its creation time, the request fields it echoes) and builds the object in
each state: ``in_progress`` with no output yet, then finished, with one
assistant message holding one ``output_text`` part. A finished response is
``completed``, or ``incomplete`` with ``incomplete_details.reason``
"max_output_tokens" when the engine stopped it for length; its ``usage``
counts ``input_tokens`` (cached ones in ``input_tokens_details``, which
also has the ``cache_write_tokens`` OpenAI's types require: 0),
``output_tokens`` and ``total_tokens``.

``ResponseEvents`` numbers a stream's events (``sequence_number`` from 0)
and writes them as OpenAI sends them (an ``event:`` line naming the type,
then the ``data:`` line): ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per piece of text, then
``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done`` and ``response.completed`` with the finished
response, whatever its status (as vLLM ends every stream). The message's
``id`` is the same in every event and in the finished response, as the
``openai`` client's stream helpers check.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field

_ENCODER = json.JSONEncoder(ensure_ascii=False)


def new_response_id() -> str:
    return f"resp_{secrets.token_hex(16)}"


def response_usage(usage: dict) -> dict:
    """``Generation.usage()`` in the Responses API's terms: prefix-cache hits
    are ``cached_tokens``; ``cache_write_tokens`` (OpenAI's count of tokens
    written to its retained prompt cache, a field its types require) is 0,
    as this server keeps no such cache."""
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {
                "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"]}


def status_of(finish_reason: str | None) -> str:
    """A finished response's status: "incomplete" when it ran out of tokens."""
    return "incomplete" if finish_reason == "length" else "completed"


@dataclass
class ResponseShape:
    """``echo``: the request fields the Response repeats (model, instructions,
    the sampling values it ran with, ...)."""

    echo: dict
    id: str = field(default_factory=new_response_id)
    message_id: str = field(default_factory=lambda: f"msg_{secrets.token_hex(16)}")
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict], usage: dict | None) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "error": None, "incomplete_details": incomplete,
                "output": output, "usage": usage, **self.echo}

    def started(self) -> dict:
        return self.body("in_progress", [], None)

    def finished(self, text: str, finish_reason: str | None, usage: dict) -> dict:
        status = status_of(finish_reason)
        body = self.body(status, [self.message(text, status)], response_usage(usage))
        if status == "completed":
            body["completed_at"] = int(time.time())
        return body

    def message(self, text: str | None, status: str) -> dict:
        """The answer's message item (``text`` None: before any part)."""
        content = [] if text is None else [output_text(text)]
        return {"id": self.message_id, "type": "message", "role": "assistant",
                "status": status, "content": content}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class ResponseEvents:
    shape: ResponseShape
    sequence_number: int = 0

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {_ENCODER.encode(payload)}\n\n"

    def _place(self) -> dict:
        return {"item_id": self.shape.message_id, "output_index": 0, "content_index": 0}

    def opening(self) -> list[str]:
        """The events before any text: the response created and in progress,
        its message and the message's empty text part added."""
        started = self.shape.started()
        return [self.event("response.created", response=started),
                self.event("response.in_progress", response=started),
                self.event("response.output_item.added", output_index=0,
                           item=self.shape.message(None, "in_progress")),
                self.event("response.content_part.added", **self._place(),
                           part=output_text(""))]

    def delta(self, text: str) -> str:
        return self.event("response.output_text.delta", **self._place(), delta=text,
                          logprobs=[])

    def closing(self, finished: dict) -> list[str]:
        """The events after the last text, ``finished`` (``ResponseShape.
        finished``) last."""
        item = finished["output"][0]
        part = item["content"][0]
        return [self.event("response.output_text.done", **self._place(), text=part["text"],
                           logprobs=[]),
                self.event("response.content_part.done", **self._place(), part=part),
                self.event("response.output_item.done", output_index=0, item=item),
                self.event("response.completed", response=finished)]

    def error(self, message: str, code: str) -> str:
        """The event that ends a stream the server could not finish."""
        return self.event("error", code=code, message=message, param=None)
