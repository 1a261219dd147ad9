"""Function tools on OpenAI's Responses API (``POST /v1/responses``), driven
by the official ``openai`` client, on ``tiny`` with a tool-use chat
template (``tests/helpers/tool_template.py``), served with the hermes
tool-call parser and the response store.

The reference for every answer is the same request through
``client.chat.completions.create``, whose tool calling its own tests hold
against the engine: a forced (named or required) call over responses is
the chat's call (name, arguments) for the same seed, on a prompt of as
many tokens (the flat tools render as the chat's); "auto", forced to one
known text with vLLM's ``structured_outputs``, gives the chat's content
and calls, as items in the order of the text; a conversation that feeds a
call's ``function_call_output`` back, in the input or after
``previous_response_id``, is answered as the chat conversation with a
"tool" message, and lists the call and its output as input items of the
``openai`` package's types. Streamed, a call's events come in the
documented order,
its argument deltas join into its whole arguments, the client's stream
helper rebuilds the whole answer, and every answer and event validates as
the ``openai`` package's types. A named call of blank text, which no
grammar lets tiny write, is checked in process over an engine link that
answers with it."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.responses import (
    ResponseFunctionToolCallItem,
    ResponseFunctionToolCallOutputItem,
    ResponseInputMessageItem,
)
from starlette.testclient import TestClient

from checkpoint.tokenizer import Tokenizer
from serving.http.app import create_app
from tests.helpers.engine_links import AnsweringLink
from tests.helpers.http_utils import (
    openai_client,
    serving_tiny_with_tools,
    typed_responses,
)

pytestmark = pytest.mark.timeout(300)

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 6},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
ALARM = {"type": "object", "properties": {"at": {"enum": ["06:00", "07:30"]}},
         "required": ["at"], "additionalProperties": False}
FLAT_TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather ahead.",
     "parameters": WEATHER, "strict": True},
    {"type": "function", "name": "set_alarm", "parameters": ALARM, "strict": True},
]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
              for t in FLAT_TOOLS]
QUESTION = "Weather in Oslo, and wake me up?"
NAMED = {"type": "function", "name": "get_weather"}
CHAT_NAMED = {"type": "function", "function": {"name": "get_weather"}}
AUTO_TEXT = ('Checking.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", '
             '"days": 2}}</tool_call>\n<tool_call>{"name": "set_alarm", "arguments": '
             '{"at": "06:00"}}</tool_call>\nDone.')
CALL_EVENTS = ["response.output_item.added", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done"]
MESSAGE_OPEN = ["response.output_item.added", "response.content_part.added"]
TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}
MESSAGE_CLOSE = ["response.output_text.done", "response.content_part.done",
                 "response.output_item.done"]


def literal(text: str) -> str:
    """A regex that matches ``text`` and nothing else."""
    return "".join("\\n" if c == "\n" else "\\" + c if c in "\\.+*?()|[]{}^$" else c
                   for c in text)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny_with_tools(tmp_path_factory.mktemp("http"), "--enable-auto-tool-choice",
                                 "--tool-call-parser", "hermes",
                                 "--enable-responses-api-store") as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


def _respond(client, server, **fields):
    return client.responses.create(model=server.model_dir, input=QUESTION, tools=FLAT_TOOLS,
                                   **fields)


def _chat(client, server, messages=None, **fields):
    return client.chat.completions.create(
        model=server.model_dir, messages=messages or [{"role": "user", "content": QUESTION}],
        tools=CHAT_TOOLS, **fields)


def _calls(response) -> list[tuple[str, str]]:
    return [(item.name, item.arguments) for item in response.output
            if item.type == "function_call"]


def _chat_calls(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def _runs(kinds: list[str]) -> list[str]:
    """Event kinds with each run of one kind of delta event told once."""
    return [k for i, k in enumerate(kinds) if not (k.endswith(".delta") and i and
                                                   kinds[i - 1] == k)]


def test_a_forced_named_call_is_the_chats(client, server):
    finished = 0
    for seed in range(3):
        response = _respond(client, server, tool_choice=NAMED, temperature=1.0,
                            max_output_tokens=80, extra_body={"seed": seed})
        chat = _chat(client, server, tool_choice=CHAT_NAMED, temperature=1.0, max_tokens=80,
                     seed=seed)
        [call] = response.output
        [chat_call] = chat.choices[0].message.tool_calls
        assert (call.type, call.name) == ("function_call", "get_weather")
        assert call.arguments == chat_call.function.arguments
        assert call.call_id.startswith("call_") and call.id.startswith("fc_")
        assert response.usage.input_tokens == chat.usage.prompt_tokens
        assert response.usage.output_tokens == chat.usage.completion_tokens
        if chat.choices[0].finish_reason == "stop":
            finished += 1
            assert json.loads(call.arguments) == json.loads(chat_call.function.arguments)
            assert call.status == response.status == "completed"
        else:
            assert call.status == response.status == "incomplete"
        assert [t.name for t in response.tools] == ["get_weather", "set_alarm"]
        assert response.tool_choice.name == "get_weather"
    assert finished >= 1


def test_required_calls_are_the_chats(client, server):
    for seed in range(2):
        response = _respond(client, server, tool_choice="required", temperature=1.0,
                            max_output_tokens=300, extra_body={"seed": seed})
        chat = _chat(client, server, tool_choice="required", temperature=1.0, max_tokens=300,
                     seed=seed)
        assert _calls(response) == _chat_calls(chat.choices[0].message)
        # Each item closed before the end is completed; the last one takes
        # the response's status (a call the answer was cut in: incomplete).
        assert _calls(response) and all(item.type == "function_call" for item in
                                        response.output)
        assert [item.status for item in response.output] == \
            ["completed"] * (len(response.output) - 1) + [response.status]
        assert len({item.call_id for item in response.output}) == len(response.output)


def test_auto_gives_the_chats_content_and_calls_in_the_order_of_the_text(client, server):
    """"auto" reads the text with the server's parser: content before the
    calls is a message, each call an item, content after them a second
    message; together the chat's content and calls."""
    forced = {"structured_outputs": {"regex": literal(AUTO_TEXT)}}
    response = _respond(client, server, max_output_tokens=200, extra_body=forced)
    chat = _chat(client, server, max_tokens=200, extra_body=forced)
    assert [item.type for item in response.output] == ["message", "function_call",
                                                       "function_call", "message"]
    assert chat.choices[0].message.content == "Checking.\nDone."
    assert response.output[0].content[0].text + response.output[3].content[0].text == \
        chat.choices[0].message.content
    assert _calls(response) == _chat_calls(chat.choices[0].message) == [
        ("get_weather", json.dumps({"city": "Oslo", "days": 2})),
        ("set_alarm", json.dumps({"at": "06:00"}))]
    assert response.status == "completed"
    events = list(_respond(client, server, max_output_tokens=200, extra_body=forced,
                           stream=True))
    assert _runs([e.type for e in events]) == [
        "response.created", "response.in_progress", *MESSAGE_OPEN,
        "response.output_text.delta", *MESSAGE_CLOSE, *CALL_EVENTS, *CALL_EVENTS, *MESSAGE_OPEN,
        "response.output_text.delta", *MESSAGE_CLOSE, "response.completed"]
    # Each call's arguments come in several deltas, joining into its arguments.
    final = events[-1].response
    for item in final.output[1:3]:
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"
                  and e.item_id == item.id]
        assert len(deltas) > 3 and "".join(deltas) == item.arguments
    assert [(i.type, getattr(i, "name", None)) for i in final.output] == \
        [(i.type, getattr(i, "name", None)) for i in response.output]
    assert _calls(final) == _calls(response)


def _call_events_check(events, whole) -> None:
    """A stream of one named call: its events in order, one id throughout,
    argument deltas joining into the whole answer's arguments."""
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     *["response.function_call_arguments.delta"] * len(deltas),
                     "response.function_call_arguments.done", "response.output_item.done",
                     "response.completed"]
    assert len(deltas) >= 2
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done, item_done, final = events[2], events[-3], events[-2], events[-1].response
    assert added.item.arguments == "" and added.item.status == "in_progress"
    joined = "".join(e.delta for e in deltas)
    assert joined == done.arguments == item_done.item.arguments == final.output[0].arguments \
        == whole.output[0].arguments
    item_id = added.item.id
    assert {e.item_id for e in deltas} | {done.item_id, item_done.item.id,
                                          final.output[0].id} == {item_id}
    assert added.item.call_id == item_done.item.call_id == final.output[0].call_id
    assert item_done.item.status == final.output[0].status == whole.output[0].status


def test_a_streamed_call_joins_into_the_whole_one(client, server):
    ask = dict(tool_choice=NAMED, temperature=1.0, max_output_tokens=80,
               extra_body={"seed": 2})  # a whole call: the helper parses a strict one
    whole = _respond(client, server, **ask)
    events = list(_respond(client, server, **ask, stream=True))
    _call_events_check(events, whole)
    with client.responses.stream(model=server.model_dir, input=QUESTION, tools=FLAT_TOOLS,
                                 **ask) as stream:  # the client's own checks of the events
        rebuilt = stream.get_final_response()
    assert _calls(rebuilt) == _calls(whole)
    required = dict(tool_choice="required", temperature=1.0, max_output_tokens=300,
                    extra_body={"seed": 0})
    events = list(_respond(client, server, **required, stream=True))
    whole = _respond(client, server, **required)
    assert _runs([e.type for e in events]) == ["response.created", "response.in_progress",
                                               *CALL_EVENTS * len(_calls(whole)),
                                               TERMINAL[whole.status]]
    assert _calls(events[-1].response) == _calls(whole)


@pytest.mark.parametrize("fields", [
    {"tool_choice": NAMED, "temperature": 1.0, "seed": 2, "max_output_tokens": 80},
    {"tool_choice": "required", "temperature": 1.0, "seed": 0, "max_output_tokens": 300},
    {"max_output_tokens": 200, "structured_outputs": {"regex": literal(AUTO_TEXT)}},
])
def test_call_answers_validate_as_the_openai_packages_types(server, fields):
    whole, events = typed_responses(server.url, {"model": server.model_dir, "input": QUESTION,
                                                 "tools": FLAT_TOOLS, **fields})
    assert any(item.type == "function_call" for item in whole.output)
    assert events[-1].type == TERMINAL[events[-1].response.status]
    assert events[-1].response.status == whole.status  # the same seed, or no sampling
    assert [i.type for i in events[-1].response.output] == [i.type for i in whole.output]


def _first_turn(client, server):
    first = _respond(client, server, tool_choice=NAMED, temperature=1.0, max_output_tokens=80,
                     extra_body={"seed": 0})  # a seed whose call is whole
    [call] = first.output
    assert call.status == "completed"
    chat_call = {"id": call.call_id, "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments}}
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": None, "tool_calls": [chat_call]},
               {"role": "tool", "tool_call_id": call.call_id, "content": "Snow, then sun."}]
    return first, call, history


def test_a_function_call_output_is_the_chats_tool_message(client, server):
    """The first turn's output fed back with the call's output, in the
    input or after previous_response_id, is answered as the chat with the
    assistant's call and a "tool" message."""
    first, call, history = _first_turn(client, server)
    output = {"type": "function_call_output", "call_id": call.call_id,
              "output": "Snow, then sun."}
    ask = dict(tools=FLAT_TOOLS, tool_choice="none", temperature=0, max_output_tokens=12)
    chat = _chat(client, server, history, tool_choice="none", temperature=0, max_tokens=12)
    inline = client.responses.create(
        model=server.model_dir, input=[{"role": "user", "content": QUESTION}, *first.output,
                                       output], **ask)
    chained = client.responses.create(model=server.model_dir, input=[output],
                                      previous_response_id=first.id, **ask)
    for second in (inline, chained):
        assert second.output_text == chat.choices[0].message.content
        assert second.usage.input_tokens == chat.usage.prompt_tokens
    parts = client.responses.create(model=server.model_dir, input=[
        {"role": "user", "content": QUESTION}, *first.output,
        {**output, "output": [{"type": "input_text", "text": "Snow, then sun."}]}], **ask)
    assert parts.output_text == chat.choices[0].message.content
    for second, given in ((chained, "Snow, then sun."), (inline, "Snow, then sun."),
                          (parts, [{"type": "input_text", "text": "Snow, then sun."}])):
        _check_input_items(server, second.id, call, given)


def _check_input_items(server, response_id: str, call, output) -> None:
    """The question, the call as it was answered (its id kept) and its
    output, as OpenAI lists input items."""
    raw = httpx.get(f"{server.url}/v1/responses/{response_id}/input_items",
                    params={"order": "asc"}, timeout=60).json()["data"]
    question = ResponseInputMessageItem.model_validate(raw[0])
    listed_call = ResponseFunctionToolCallItem.model_validate(raw[1])
    listed_output = ResponseFunctionToolCallOutputItem.model_validate(raw[2])
    assert len(raw) == 3 and question.role == "user"
    assert [(p.type, p.text) for p in question.content] == [("input_text", QUESTION)]
    assert (listed_call.id, listed_call.call_id, listed_call.name, listed_call.arguments,
            listed_call.status) == (call.id, call.call_id, call.name, call.arguments,
                                    "completed")
    assert (listed_output.call_id, listed_output.status) == (call.call_id, "completed")
    got = listed_output.output
    assert (got if isinstance(got, str) else [p.model_dump(exclude_none=True) for p in got]) \
        == output


def test_calls_after_an_assistant_message_join_it(client, server):
    """A message and the calls after it are one assistant turn (its content
    and tool_calls), as the chat sends it."""
    _, call, history = _first_turn(client, server)
    said = {"role": "assistant", "content": "Let me look."}
    chat = _chat(client, server, [history[0], {**history[1], "content": "Let me look."},
                                  history[2]], tool_choice="none", temperature=0, max_tokens=12)
    response = client.responses.create(
        model=server.model_dir, tools=FLAT_TOOLS, tool_choice="none", temperature=0,
        max_output_tokens=12, input=[
            {"role": "user", "content": QUESTION}, said,
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id,
             "output": "Snow, then sun."}])
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_logprobs_beside_auto_are_refused_naming_include(client, server):
    with pytest.raises(openai.BadRequestError) as raised:
        _respond(client, server, include=["message.output_text.logprobs"], max_output_tokens=4)
    assert raised.value.param == "include" and '"auto"' in raised.value.message
    plain = _respond(client, server, tool_choice="none", include=[
        "message.output_text.logprobs"], max_output_tokens=4, temperature=0)
    assert len(plain.output[0].content[0].logprobs) == plain.usage.output_tokens


@pytest.mark.parametrize("choice, chat_choice", [(NAMED, CHAT_NAMED), ("required", "required")])
def test_logprobs_beside_a_forced_call_are_refused_naming_include(client, server, choice,
                                                                   chat_choice):
    """A named or required choice's answer is calls, with no output text to
    hold logprobs: asked for, they are a 400 naming ``include`` (not an
    answer silently without them). The chat, whose logprobs cover a
    call's tokens, serves the same request with one entry per token."""
    with pytest.raises(openai.BadRequestError) as raised:
        _respond(client, server, tool_choice=choice, include=["message.output_text.logprobs"],
                 top_logprobs=2, max_output_tokens=8)
    assert raised.value.param == "include"
    assert "function calls" in raised.value.message
    chat = _chat(client, server, tool_choice=chat_choice, logprobs=True, top_logprobs=2,
                 max_tokens=8, temperature=0)
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens == 8


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_call_of_blank_text_is_no_call_on_either_route(tiny_dir, stream):
    """In process, through the ``openai`` client, over an engine link that
    answers every request with blank text (white space alone: tiny's JSON
    grammar never lets a forced call begin so, so no served model shows
    it): a named call of blank text is no call. The chat answers content
    "" without tool_calls (no tool_calls in its stream), and Responses one
    empty message and no function_call (no call events in its stream)."""
    link = AnsweringLink([32, 10, 32], " \n ", "stop")
    app = create_app(link, Tokenizer.from_dir(tiny_dir), ["tiny"], 4096)
    chat_ask = dict(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                    tools=CHAT_TOOLS, tool_choice=CHAT_NAMED, max_tokens=8)
    ask = dict(model="tiny", input=QUESTION, tools=FLAT_TOOLS, tool_choice=NAMED,
               max_output_tokens=8)
    with TestClient(app) as http, openai.OpenAI(base_url="http://testserver/v1",
                                                api_key="none", http_client=http,
                                                max_retries=0) as client:
        if stream:
            chunks = list(client.chat.completions.create(**chat_ask, stream=True))
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            assert not any(d.tool_calls for d in deltas)
            assert "".join(d.content or "" for d in deltas) == ""
            assert chunks[-1].choices[0].finish_reason == "stop"
            events = list(client.responses.create(**ask, stream=True))
            assert not any(e.type.startswith("response.function_call") for e in events)
            assert [e.item.type for e in events if e.type == "response.output_item.added"] \
                == ["message"]
            response = events[-1].response
        else:
            chat = client.chat.completions.create(**chat_ask)
            message = chat.choices[0].message
            assert (message.content, message.tool_calls, chat.choices[0].finish_reason) == \
                ("", None, "stop")
            response = client.responses.create(**ask)
    assert [i.type for i in response.output] == ["message"]
    assert [p.text for p in response.output[0].content] == [""]
    assert (response.status, response.usage.output_tokens) == ("completed", 3)


def test_a_call_cut_short_leaves_the_stored_conversation_usable(client, server):
    """A named call cut at max_output_tokens (its arguments no JSON text)
    was never made: the conversation after it, over previous_response_id,
    is answered as the chat without it (the question, then the next turn)."""
    cut = _respond(client, server, tool_choice=NAMED, temperature=0, max_output_tokens=3)
    [call] = cut.output
    assert (cut.status, call.type) == ("incomplete", "function_call")
    with pytest.raises(ValueError):
        json.loads(call.arguments)
    chat = _chat(client, server, [{"role": "user", "content": QUESTION},
                                  {"role": "user", "content": "Go on."}],
                 tool_choice="none", temperature=0, max_tokens=12)
    after = client.responses.create(model=server.model_dir, input="Go on.", tools=FLAT_TOOLS,
                                    tool_choice="none", temperature=0, max_output_tokens=12,
                                    previous_response_id=cut.id)
    assert after.output_text == chat.choices[0].message.content
    assert after.usage.input_tokens == chat.usage.prompt_tokens
