"""The tool-call pieces without a server: the schema "required" holds the
output to (``jsonschema`` decides what it accepts), and the readers that
turn a choice's text into calls, fed the text in pieces of every size
(the ``json`` module's reading of the whole text is the reference), and
a named call's blank text, which is no call in a chat stream, a chat
message or a Responses answer alike."""

from __future__ import annotations

import json

import jsonschema
import pytest

from checkpoint.tiny_model import EOS
from engine import SamplingParams
from engine.structured_outputs import StructuredOutputManager
from serving.http.protocol import ChatCompletionRequest
from serving.http.responses_items import OutputItems
from serving.http.tool_parsers import TOOL_CALL_PARSERS
from serving.http.tools import NamedCallReader, RequiredCallsReader, tool_choice_of
from tests.helpers.tool_stream import argument_pieces, assembled, pieces_of, splits

UNIT = {"enum": ["C", "F"]}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"$ref": "#/$defs/unit"}},
                       "required": ["city", "unit"], "$defs": {"unit": UNIT}}}},
    {"type": "function", "function": {"name": "now"}},
]
MESSAGES = [{"role": "user", "content": "hi"}]


def _choice(**fields):
    return tool_choice_of(ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, **fields))


def test_required_schema_accepts_calls_of_the_tools_and_nothing_else():
    schema = _choice(tool_choice="required").schema
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [[{"name": "now", "parameters": {}}],
            [{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "C"}},
             {"name": "now", "parameters": {}}]]
    bad = [[],  # at least one call
           [{"name": "fly", "parameters": {}}],  # not a tool
           [{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "K"}}],  # via $defs
           [{"name": "get_weather", "parameters": {"city": "Oslo"}}],
           [{"name": "now"}],
           [{"name": "now", "parameters": {}, "why": "x"}],
           {"name": "now", "parameters": {}}]
    for calls in good:
        jsonschema.validate(calls, schema)
    for calls in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(calls, schema)
    single = _choice(tool_choice="required", parallel_tool_calls=False).schema
    jsonschema.validate(good[0], single)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good[1], single)
    # The request's own tools are left as they were sent.
    assert "$defs" in TOOLS[0]["function"]["parameters"]


# Tools whose parameters refer to their own parts: through draft-7
# "definitions", to their root (a tree), through $defs of one name that
# two tools define differently, and inside an $id (references relative to it).
REF_TOOLS = [
    {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"label": {"$ref": "#/definitions/short"}},
        "required": ["label"], "definitions": {"short": {"type": "string", "maxLength": 3}}}}},
    {"type": "function", "function": {"name": "tree", "parameters": {
        "type": "object", "properties": {"v": {"type": "integer"},
                                         "kids": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["v"]}}},
    {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/x"}}, "required": ["x"],
        "$defs": {"x": {"enum": ["a", "b"]}}}}},
    {"type": "function", "function": {"name": "count", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/x"}}, "required": ["x"],
        "$defs": {"x": {"type": "integer", "minimum": 0}}}}},
    {"type": "function", "function": {"name": "flag", "parameters": {
        "$id": "https://example.com/flag", "type": "object",
        "properties": {"on": {"$ref": "#/$defs/on"}}, "required": ["on"],
        "$defs": {"on": {"type": "boolean"}}}}},
]


def test_required_schema_keeps_each_tools_references(tiny_dir):
    """Each tool's local references still name its own parts once its
    parameters sit inside the array of calls: ``jsonschema`` checks the
    calls through them, and the engine's grammar compiles."""
    request = ChatCompletionRequest(messages=MESSAGES, tools=REF_TOOLS, tool_choice="required")
    schema = tool_choice_of(request).schema
    good = [{"name": "tag", "parameters": {"label": "abc"}},
            {"name": "tree", "parameters": {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}},
            {"name": "pick", "parameters": {"x": "a"}},
            {"name": "count", "parameters": {"x": 7}},
            {"name": "flag", "parameters": {"on": True}}]
    bad = [{"name": "tag", "parameters": {"label": "abcd"}},
           {"name": "tree", "parameters": {"v": 1, "kids": [{"v": "2"}]}},
           {"name": "pick", "parameters": {"x": 7}},
           {"name": "count", "parameters": {"x": "a"}},
           {"name": "flag", "parameters": {"on": 1}}]
    jsonschema.validate(good, schema)
    for call in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([call], schema)
    # tiny's byte-level vocabulary: id b is byte b, so a text is its bytes.
    params = SamplingParams(structured_outputs=tool_choice_of(request).constraint())
    manager = StructuredOutputManager(f"{tiny_dir}/tokenizer.json", 320, [EOS], timeout_s=30)
    try:
        manager.check(params)
        grammar = manager.new_grammar(params)
        assert all(grammar.accept(b) for b in json.dumps(good).encode())
        assert grammar.accept(EOS) and grammar.is_terminated()
        for call in bad:
            grammar = manager.new_grammar(params)
            assert not all(grammar.accept(b) for b in json.dumps([call]).encode())
    finally:
        manager.shutdown()


def test_a_named_choice_is_held_to_its_tools_parameters():
    named = _choice(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert (named.mode, named.name) == ("named", "get_weather")
    assert named.schema == TOOLS[0]["function"]["parameters"]
    assert json.loads(named.constraint().json) == named.schema
    empty = _choice(tool_choice={"type": "function", "function": {"name": "now"}})
    jsonschema.validate({}, empty.schema)
    assert _choice(tool_choice="none").constraint() is None


NAMED = {"type": "function", "function": {"name": "now"}}


@pytest.mark.parametrize("parser", ["hermes", "mistral"])
def test_a_parser_that_reads_special_tokens_shows_them_under_every_choice_but_none(parser):
    """vLLM's hermes and mistral parsers set ``skip_special_tokens`` false
    on every request with tools whose choice is not "none" (their
    ``adjust_request``, called for named and "required" choices as for
    "auto"); "none" leaves the request's own value."""
    reader = TOOL_CALL_PARSERS[parser]
    for choice in ("auto", "required", NAMED):
        resolved = tool_choice_of(ChatCompletionRequest(messages=MESSAGES, tools=TOOLS,
                                                        tool_choice=choice), reader)
        assert resolved.skip_special_tokens(True) is False, choice
        assert resolved.skip_special_tokens(False) is False, choice
    none = tool_choice_of(ChatCompletionRequest(messages=MESSAGES, tools=TOOLS,
                                                tool_choice="none"), reader)
    assert none.skip_special_tokens(True) is True
    assert none.skip_special_tokens(False) is False


def test_a_parser_that_reads_text_alone_leaves_skip_special_tokens_as_asked():
    reader = TOOL_CALL_PARSERS["llama3_json"]
    for choice in ("auto", "required", NAMED, "none"):
        resolved = tool_choice_of(ChatCompletionRequest(messages=MESSAGES, tools=TOOLS,
                                                        tool_choice=choice), reader)
        assert resolved.skip_special_tokens(True) is True, choice
    # Without a parser (no --tool-call-parser) nothing changes either.
    assert _choice(tool_choice="required").skip_special_tokens(True) is True




ARRAYS = [
    '[{"name": "now", "parameters": {}}]',
    ' [ {"name":"get_weather","parameters":{"city":"Os]lo} \\"x\\" {","unit":"C"}} ,\n'
    '{ "parameters" : {"nested": [{"a": [1, {"b": "]}"}]}], "u": "é😀"}, "name": "now"}\t]',
]




@pytest.mark.parametrize("text", ARRAYS)
def test_required_reader_streams_each_elements_arguments(text):
    """Each element is one call, its arguments json.dumps' text of its
    parameters, streamed in pieces that add up to the message's call."""
    want = [(e["name"], json.dumps(e["parameters"], ensure_ascii=False))
            for e in json.loads(text)]
    for pieces in splits(text):
        reader = RequiredCallsReader()
        entries = [e for i, piece in enumerate(pieces)
                   for e in reader.add(piece, last=i == len(pieces) - 1)]
        calls = reader.calls()
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == want
        assert assembled(entries) == calls
        assert len({c["id"] for c in calls}) == len(calls)
        assert reader.finish_reason("stop") == "tool_calls"
        assert reader.finish_reason("length") == "length"
    reader = RequiredCallsReader()  # character by character: many pieces
    entries = [e for char in text for e in reader.add(char)]
    assert len(argument_pieces(entries, 0)) >= min(10, len(want[0][1]))


def test_required_reader_keeps_a_cut_element_as_far_as_it_came():
    """An element cut once its name and parameters began is a call with
    the arguments so far (in the stream and the message alike); one cut
    before is none."""
    text = ARRAYS[1]
    cut = text.index('{ "parameters"') + 30
    reader = RequiredCallsReader()
    entries = reader.add(text[:cut], last=True)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in reader.calls()] == \
        [("get_weather", '{"city": "Os]lo} \\"x\\" {", "unit": "C"}')]
    assert assembled(entries) == reader.calls()
    late = RequiredCallsReader()  # its name comes after its parameters
    late.add('[{"parameters": {"a": 1}, "na', last=True)
    assert late.calls() == []
    started = RequiredCallsReader()
    started.add('[{"name": "now", "parameters": {"a": [1, 2', last=True)
    assert [c["function"]["arguments"] for c in started.calls()] == ['{"a": [1, 2']
    empty = RequiredCallsReader()
    empty.add('[{"name": "no', last=True)
    assert empty.calls() == [] and empty.finish_reason("stop") == "stop"


def test_named_reader_streams_the_text_as_arguments():
    text = '{"city": "Oslo", "unit": "C"}'
    for size in (1, 4, len(text)):
        reader = NamedCallReader("get_weather")
        entries = [e for piece in pieces_of(text, size) for e in reader.add(piece)]
        [call] = reader.calls()
        assert entries[0] == {"index": 0, "id": call["id"], "type": "function",
                              "function": {"name": "get_weather", "arguments": ""}}
        assert argument_pieces(entries, 0) == pieces_of(text, size)
        assert assembled(entries) == [{"id": call["id"], "type": "function",
                                       "function": {"name": "get_weather", "arguments": text}}]
        assert reader.finish_reason("stop") == "stop"
    assert NamedCallReader("now").calls() == []


@pytest.mark.parametrize("text", ["", " ", " \n\t ", '\n {"city": "Oslo"}'])
def test_a_named_call_starts_at_its_first_non_blank_character(text):
    """Blank text is no call: streamed (no entry), in the chat's whole
    message (no ``tool_calls``) and in a Responses answer (one empty
    message, as the chat's content ""); text with more than blank makes
    one call of all of it, the blank before included, in every form."""
    for size in (1, 3, max(len(text), 1)):
        reader = NamedCallReader("get_weather")
        entries = [e for piece in pieces_of(text, size) for e in reader.add(piece)]
        items = OutputItems(NamedCallReader("get_weather"))
        events = [e for piece in pieces_of(text, size) for e in items.add(piece, [], last=False)]
        events += items.finish("completed")
        kinds = {kind for kind, _ in events}
        if not text.strip():
            assert entries == [] and reader.message() == {"content": ""}
            assert [(i["type"], i["content"][0]["text"]) for i in items.items] == \
                [("message", "")]
            assert "response.function_call_arguments.delta" not in kinds
            continue
        assert assembled(entries) == reader.calls()
        assert entries[0]["function"]["name"] == "get_weather"
        assert "".join(e["function"]["arguments"] for e in entries) == text
        assert reader.message()["tool_calls"][0]["function"]["arguments"] == text
        assert [(i["type"], i["arguments"]) for i in items.items] == [("function_call", text)]
