"""``OutputItems``: a Responses answer's output items, built as its text
comes, and the stream events that tell a client of each step. A whole
answer and a stream are built alike; the whole one drops the events.

Without a tool reader (no tools, or tool_choice "none"), the answer is one
message with one ``output_text`` part holding all of its text, opened
before any text comes. With one (``tools.ToolCallReader``), the reader's
pieces make the items in the order of the answer: content goes to a
message, each call to a ``function_call`` item. Items follow one another:
the one being written is closed (its done events sent) before the next is
added, so text after a run of calls is a second message. A call's
arguments grow, one ``response.function_call_arguments.delta`` per piece
the reader lets out, until the next item opens or the answer ends. An answer that leaves no item is one empty message, as its chat
answer is then empty content. An item closed before the end is
"completed"; the one still open at the end takes the response's status.
With a reasoning parser (``answer_reader.ReasonedReader``) the reasoning
comes first, as one ``reasoning`` item holding one ``reasoning_text``
part (vLLM's), then the content's items as above.

Logprobs (``add``'s, the chat's entries for the answer's tokens that came
with the text) belong to the message's text: the route refuses them beside
any tool choice but "none" (with "auto" which tokens are content is not
known, and a forced call has no text to hold them). Without a reader they
go with their text as they come. After a reasoning (a ``ReasonedReader``,
the route having kept only the tokens after the end tag) they wait for
the message's first text, which the reader may still hold back as a
possible tag or not have read yet, and then go with it, or alone once the
message is open; an answer whose message never comes has none to hold.

Events, as ``(type, fields)`` without the sequence number: for a message
``response.output_item.added`` (empty, in progress),
``response.content_part.added`` (an empty ``output_text``), one
``response.output_text.delta`` per piece of text (or of logprobs, whose
text a stop string may still hold back), then
``response.output_text.done``, ``response.content_part.done`` and
``response.output_item.done``; for a call ``response.output_item.added``
(arguments "", in progress), one ``response.function_call_arguments.delta``
per piece of arguments, ``response.function_call_arguments.done`` and
``response.output_item.done``; for reasoning ``response.output_item.added``
(no content yet, in progress), ``response.content_part.added`` (an empty
``reasoning_text``), one ``response.reasoning_text.delta`` per piece,
then ``response.reasoning_text.done``, ``response.content_part.done`` and
``response.output_item.done``. An item keeps its id (and a call its
``call_id``) in every event and in the finished response, as the
``openai`` client's stream helper checks.

No text is copied whole for a piece: the open item's text (a message's or
a reasoning's) or arguments (a call's) is kept as the pieces written
(``written``), its field left "" until the item closes, where they are
joined once; the logprobs list is extended where it lies. So an answer's
work is its length, not the square of it.
"""

from __future__ import annotations

from typing import Any

from serving.http.answer_reader import ReasonedReader
from serving.http.responses_output import (
    event_logprobs,
    function_call_item,
    message_item,
    new_id,
    output_text,
    reasoning_item,
    reasoning_text,
)
from serving.http.tools import ToolCallReader

Event = tuple[str, dict[str, Any]]


class OutputItems:
    def __init__(self, reader: ToolCallReader | ReasonedReader | None) -> None:
        self.reader = reader
        self.items: list[dict] = []  # every item so far, the open one last
        self.open: dict | None = None  # the item being written
        self.written: list[str] = []  # the open item's text or arguments, joined at its close
        self.waiting: list[dict] = []  # answer logprobs before the message's first text

    def start(self) -> list[Event]:
        """The events before any text: a plain answer's message opened."""
        return self._open_message() if self.reader is None else []

    def add(self, text: str, logprobs: list[dict], last: bool) -> list[Event]:
        """The events for new text (and its tokens' logprobs); ``last`` on
        the answer's final piece."""
        if self.reader is None:
            return self._write_text(text, logprobs)
        self.waiting += logprobs
        events: list[Event] = []
        for kind, value in self.reader.pieces(text, last):
            if kind == "reasoning":
                events += self._write_reasoning(value)
            elif kind == "content":
                events += self._write_text(value, self._take_waiting())
            else:
                events += self._write_call(value)
        if self.waiting and self.open is not None and self.open["type"] == "message":
            events += self._write_text("", self._take_waiting())
        return events

    def _take_waiting(self) -> list[dict]:
        waiting, self.waiting = self.waiting, []
        return waiting

    def finish(self, status: str) -> list[Event]:
        """The events that close the answer; ``status`` is the response's."""
        events = [] if self.items else self._open_message()
        return events + self._close(status)

    def _place(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}

    def _open_message(self) -> list[Event]:
        item_id = new_id("msg")
        self.open = message_item(item_id, "in_progress", [output_text("")])
        self.items.append(self.open)
        return [("response.output_item.added", {
                    "output_index": len(self.items) - 1,
                    "item": message_item(item_id, "in_progress", [])}),
                ("response.content_part.added", {**self._place(), "content_index": 0,
                                                 "part": output_text("")})]

    def _open_call(self, name: str) -> list[Event]:
        self.open = function_call_item(new_id("fc"), new_id("call"), name, "", "in_progress")
        self.items.append(self.open)
        return [("response.output_item.added", {"output_index": len(self.items) - 1,
                                                "item": dict(self.open)})]

    def _open_reasoning(self) -> list[Event]:
        item_id = new_id("rs")
        self.open = reasoning_item(item_id, "in_progress", "")
        self.items.append(self.open)
        return [("response.output_item.added", {
                    "output_index": len(self.items) - 1,
                    "item": reasoning_item(item_id, "in_progress", None)}),
                ("response.content_part.added", {**self._place(), "content_index": 0,
                                                 "part": reasoning_text("")})]

    def _write_reasoning(self, text: str) -> list[Event]:
        events = []
        if self.open is None or self.open["type"] != "reasoning":
            events = self._close("completed") + self._open_reasoning()
        self.written.append(text)
        events.append(("response.reasoning_text.delta", {**self._place(), "content_index": 0,
                                                         "delta": text}))
        return events

    def _write_text(self, text: str, logprobs: list[dict]) -> list[Event]:
        if not text and not logprobs:
            return []
        events = []
        if self.open is None or self.open["type"] != "message":
            events = self._close("completed") + self._open_message()
        self.written.append(text)
        self.open["content"][0]["logprobs"] += logprobs
        events.append(("response.output_text.delta", {
            **self._place(), "content_index": 0, "delta": text,
            "logprobs": event_logprobs(logprobs)}))
        return events

    def _write_call(self, entry: dict) -> list[Event]:
        function = entry.get("function", {})
        events = []
        if "id" in entry:  # a call's first entry
            events = self._close("completed") + self._open_call(function["name"])
        arguments = function.get("arguments") or ""
        if arguments:
            self.written.append(arguments)
            events.append(("response.function_call_arguments.delta",
                           {**self._place(), "delta": arguments}))
        return events

    def _close(self, status: str) -> list[Event]:
        """The done events of the open item (none if none is open)."""
        if self.open is None:
            return []
        place, item = self._place(), self.open
        self.open = None
        item["status"] = status
        written, self.written = "".join(self.written), []
        if item["type"] == "function_call":
            item["arguments"] = written
        else:
            item["content"][0]["text"] = written
        done = ("response.output_item.done", {"output_index": place["output_index"],
                                              "item": item})
        if item["type"] == "function_call":
            return [("response.function_call_arguments.done",
                     {**place, "name": item["name"], "arguments": item["arguments"]}), done]
        part = item["content"][0]
        if item["type"] == "reasoning":
            return [("response.reasoning_text.done", {**place, "content_index": 0,
                                                      "text": part["text"]}),
                    ("response.content_part.done", {**place, "content_index": 0, "part": part}),
                    done]
        return [("response.output_text.done", {**place, "content_index": 0, "text": part["text"],
                                               "logprobs": event_logprobs(part["logprobs"])}),
                ("response.content_part.done", {**place, "content_index": 0, "part": part}),
                done]
