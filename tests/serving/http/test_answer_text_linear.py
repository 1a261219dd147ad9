"""The answer's text is never copied whole for each piece that streams in,
so an answer's work grows with its length, not the square of it: a long
answer fed four characters at a time, the memory each piece allocates at
its peak (``tests.helpers.allocations``: ``tracemalloc`` counts
allocations, no clock is read) summed over the pieces must about double
when the answer does, where copying the text so far at each piece would
quadruple it. What is built must be the whole answer's, every field: the
streamed deltas add up to the finished text, which is the text given."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from engine.reasoning import REASONING_PARSERS
from ipc.engine_messages import TokenLogprob
from serving.http import serving_chat, serving_completion
from serving.http.answer_reader import Reading, ReasonedReader
from serving.http.generation import ChoiceEvent
from serving.http.protocol import ChatCompletionRequest, CompletionRequest
from serving.http.reasoning import ReasoningReader
from serving.http.responses_items import OutputItems
from serving.http.stream_interval import StreamInterval
from serving.http.tool_parsers import TOOL_CALL_PARSERS
from serving.http.tools import ToolChoice
from tests.helpers.allocations import Allocations

SIZES = (300, 600)


def _quarters(text: str) -> list[str]:
    return [text[i:i + 4] for i in range(0, len(text), 4)]


def _members(n: int) -> dict:
    return {f"k{i}": [i, "vvvv", {"x": True}] for i in range(n)}


def _content(n: int) -> str:
    return "Some words of content. " * n


def _call(n: int) -> str:
    return '<tool_call>{"name": "f", "arguments": ' + json.dumps(_members(n)) + "}</tool_call>"


def _thought(n: int) -> str:
    return "Let me think this through. " * n


def _reasoned(n: int) -> str:
    return "<think>" + _thought(n) + "</think>" + _content(n)


def _reasoned_reader() -> ReasonedReader:
    return ReasonedReader(ReasoningReader(REASONING_PARSERS["deepseek_r1"], True), None)


# Responses output items: (reader, answer of size n, its items as
# (type, text or arguments) pairs).
ITEMS = {
    "message": (lambda: None, _content, lambda n: [("message", _content(n))]),
    "a call's arguments": (lambda: TOOL_CALL_PARSERS["hermes"]({}), _call,
                           lambda n: [("function_call", json.dumps(_members(n)))]),
    "reasoning, then a message": (_reasoned_reader, _reasoned,
                                  lambda n: [("reasoning", _thought(n)), ("message", _content(n))]),
}


def _item_text(item: dict) -> str:
    return item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"]


def _streamed_items(reader, text: str, count: Allocations) -> tuple[list[dict], dict]:
    """The finished items of ``text`` fed in quarters, and each item's
    text as its deltas add up to and as its done event tells it."""
    items = OutputItems(reader)
    events = items.start()
    pieces = _quarters(text)
    with count.tracing():
        for i, piece in enumerate(pieces):
            with count.piece():
                events += items.add(piece, [], last=i == len(pieces) - 1)
    events += items.finish("completed")
    deltas: dict[int, str] = {}
    done: dict[int, str] = {}
    for kind, fields in events:
        if kind.endswith(".delta"):
            deltas[fields["output_index"]] = deltas.get(fields["output_index"], "") + fields["delta"]
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            done[fields["output_index"]] = fields["text"]
        elif kind == "response.function_call_arguments.done":
            done[fields["output_index"]] = fields["arguments"]
    return items.items, {"deltas": deltas, "done": done}


@pytest.mark.parametrize("name", sorted(ITEMS))
def test_responses_items_copy_no_text_per_piece(name):
    reader, answer, expected = ITEMS[name]
    allocated = []
    for n in SIZES:
        count = Allocations()
        items, streamed = _streamed_items(reader(), answer(n), count)
        texts = [(item["type"], _item_text(item)) for item in items]
        assert texts == expected(n)
        assert all(item["status"] == "completed" for item in items)
        by_index = {i: text for i, (_, text) in enumerate(texts)}
        assert streamed["deltas"] == by_index and streamed["done"] == by_index
        allocated.append(count.total)
    assert allocated[1] <= 2.5 * allocated[0], allocated


def test_a_reasoned_chat_answer_copies_no_text_per_piece():
    """A reasoning model's chat answer (no tools): its reasoning and its
    content streamed as ``delta``s, and its message."""
    allocated = []
    for n in SIZES:
        reader, count = _reasoned_reader(), Allocations()
        pieces = _quarters(_reasoned(n))
        deltas = []
        with count.tracing():
            for i, piece in enumerate(pieces):
                with count.piece():
                    deltas.append(reader.delta(piece, last=i == len(pieces) - 1))
        assert reader.message() == {"content": _content(n), "reasoning": _thought(n)}
        assert "".join(d.get("reasoning", "") for d in deltas) == _thought(n)
        assert "".join(d.get("content", "") for d in deltas) == _content(n)
        allocated.append(count.total)
    assert allocated[1] <= 2.5 * allocated[0], allocated


class _OneChoice:
    """A stand-in for ``Generation``: one choice, whose events bring the
    given pieces of text; the work its consumer does on each event is
    counted in ``count``."""

    def __init__(self, pieces: list[str], count: Allocations) -> None:
        self.pieces, self.count = pieces, count
        self.choices = {0: SimpleNamespace(index=0, prompt_token_ids=[1, 2])}

    def prompts_by_choice(self) -> dict[int, list[int]]:
        return {0: [1, 2]}

    def starts_in_reasoning(self, index: int) -> bool:
        return False

    def usage(self) -> dict:
        return {}

    async def events(self):
        for i, piece in enumerate(self.pieces):
            reason = "stop" if i == len(self.pieces) - 1 else None
            with self.count.piece():
                yield ChoiceEvent(0, piece, [3], None, reason)


STATE = SimpleNamespace(shown_model=lambda model: model, response_role="assistant")


def _chat(generation: _OneChoice) -> str:
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
    body = asyncio.run(serving_chat._collect(STATE, request, generation, "chatcmpl-1",
                                             Reading(ToolChoice("none")), None))
    return body["choices"][0]["message"]["content"]


def _completion(generation: _OneChoice) -> str:
    request = CompletionRequest.model_validate({"model": "m", "prompt": "Hi"})
    body = asyncio.run(serving_completion._collect(STATE, request, generation, "cmpl-1", None))
    return body["choices"][0]["text"]


@pytest.mark.parametrize("collect", [_chat, _completion], ids=["chat", "completion"])
def test_a_whole_answer_copies_no_text_per_piece(collect):
    """A chat or completion answer given whole: its text gathered from the
    engine's pieces."""
    allocated = []
    for n in SIZES:
        count = Allocations()
        with count.tracing():
            text = collect(_OneChoice(_quarters(_content(n)), count))
        assert text == _content(n)
        allocated.append(count.total)
    assert allocated[1] <= 2.5 * allocated[0], allocated


def test_a_long_stream_interval_copies_no_text_per_event():
    """A stream whose interval is longer than its answer: its first event
    goes out alone, the rest is held and goes out as one with the last,
    text, token ids and logprobs in order."""
    allocated = []
    for n in SIZES:
        pieces = _quarters(_content(n))
        events = [ChoiceEvent(0, piece, [i], [[TokenLogprob(i, -1.0, 1)]],
                              "length" if i == len(pieces) - 1 else None)
                  for i, piece in enumerate(pieces)]
        grouping, count, sent = StreamInterval(10 ** 9), Allocations(), []
        with count.tracing():
            for event in events:
                with count.piece():
                    sent.append(grouping.add(event))
        sent = [event for event in sent if event is not None]
        assert [e.text for e in sent] == [pieces[0], "".join(pieces[1:])]
        assert [e.token_ids for e in sent] == [[0], list(range(1, len(pieces)))]
        assert [lp for e in sent for lp in e.logprobs] == [e.logprobs[0] for e in events]
        assert [e.finish_reason for e in sent] == [None, "length"]
        allocated.append(count.total)
    assert allocated[1] <= 2.5 * allocated[0], allocated
