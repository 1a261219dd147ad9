"""Tool calling over HTTP, driven by the official ``openai`` client, on
``tiny`` served with a tool-use chat template
(``tests/helpers/tool_template.py``).

References: transformers' ``apply_chat_template(tools=...)`` for the
prompt; ``LLM.generate`` on that prompt, held to the schema a tool choice
stands for (a named tool's parameters; for "required", the array of
{"name", "parameters"} objects vLLM documents), for the answer;
``jsonschema`` for each call's arguments; the client's own stream helper
for reassembling streamed calls. Bad tools and choices are 400s in
OpenAI's shape naming the field, and the server goes on serving."""

from __future__ import annotations

import copy
import json
import re

import httpx
import jsonschema
import openai
import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from tests.helpers.http_utils import (
    openai_client,
    serving_tiny_with_tools,
    streamed_chat_deltas,
)
from tests.helpers.tool_stream import argument_pieces, assembled

pytestmark = pytest.mark.timeout(300)

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 6},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
ALARM = {"type": "object",
         "properties": {"at": {"enum": ["06:00", "07:30"]}, "loud": {"type": "boolean"}},
         "required": ["at", "loud"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather ahead.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": ALARM}},
    {"type": "function", "function": {"name": "now"}},  # no parameters: no arguments
]
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM,
           "now": {"type": "object", "properties": {}}}
MESSAGES = [{"role": "user", "content": "Weather in Oslo, and wake me up?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def calls_schema(tools: list[dict], max_items: int | None = None) -> dict:
    """The output "required" stands for, as vLLM documents it: an array of
    one or more {"name": <a tool's name>, "parameters": <its schema>}
    (holding nothing else), at most ``max_items``."""
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                        "parameters": t["function"].get("parameters",
                                                        {"type": "object", "properties": {}})},
         "required": ["name", "parameters"], "additionalProperties": False} for t in tools]}}
    if max_items is not None:
        schema["maxItems"] = max_items
    return schema


def whole_elements(text: str) -> tuple[list[tuple[str, dict]], int]:
    """(name, parameters) of each whole element of a JSON array of objects
    that may be cut short, read one value at a time by the json module,
    and where the text after them starts."""
    decoder, out = json.JSONDecoder(), []
    at = text.index("[") + 1
    while True:
        while at < len(text) and (text[at].isspace() or text[at] == ","):
            at += 1
        try:
            element, at = decoder.raw_decode(text, at)
        except ValueError:
            return out, at
        out.append((element["name"], element["parameters"]))


_CUT_ELEMENT = re.compile(r'\{\s*"name"\s*:\s*"([^"]*)"\s*,\s*"parameters"\s*:\s*(\S.*)', re.S)
# Ends that make a JSON text cut short whole (tried in turn, before the
# brackets it leaves open are closed): inside a string, a key or a word.
_ENDINGS = ["", '"', "0", ": 0", '": 0', '"k": 0', "n\"", '0000"', "n\": 0", '0000": 0', "ue",
            "rue", "lse", "alse", "ll", "ull"]


def completed(text: str) -> str:
    """Some JSON text that ``text``, a JSON value cut short, begins."""
    closers, in_string, escaped = [], False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            closers.append("}" if char == "{" else "]")
        elif char in "}]":
            closers.pop()
    for ending in _ENDINGS:
        try:
            json.loads(text + ending + "".join(reversed(closers)))
        except ValueError:
            continue
        return text + ending + "".join(reversed(closers))
    raise AssertionError(f"no ending makes {text!r} JSON")


def check_required_calls(calls: list[tuple[str, str]], text: str, reason: str) -> None:
    """A "required" answer's calls against the engine's ``text``: one call
    per whole element, its arguments json.dumps' text of the element's
    parameters; where the answer was cut in an element whose parameters had
    begun, one more call of that name, whose arguments begin the canonical
    text of any whole value its parameters' text may grow into."""
    whole, rest = whole_elements(text)
    assert [(name, json.loads(args)) for name, args in calls[:len(whole)]] == whole
    assert all(args == json.dumps(json.loads(args), ensure_ascii=False)
               for _, args in calls[:len(whole)])
    cut = _CUT_ELEMENT.match(text, rest) if reason == "length" else None
    if cut is None:
        assert len(calls) == len(whole)
        return
    [(name, arguments)] = calls[len(whole):]
    assert name == cut.group(1)
    canonical = json.dumps(json.loads(completed(cut.group(2))), ensure_ascii=False)
    assert canonical.startswith(arguments) and arguments


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny_with_tools(tmp_path_factory.mktemp("http")) as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


@pytest.fixture(scope="module")
def reference(server):
    with LLM(model=server.model_dir, device="cpu") as llm:
        yield llm


@pytest.fixture(scope="module")
def hf(server):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server.model_dir)


def _prompt_ids(hf, messages, tools=TOOLS) -> list[int]:
    return list(hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                       tokenize=True, return_dict=False))


def _ask(client, server, **kwargs):
    return client.chat.completions.create(model=server.model_dir, messages=MESSAGES,
                                          tools=TOOLS, **kwargs)


def _calls(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def test_named_call_is_the_engines_answer_under_the_tools_schema(client, server, reference, hf):
    ids = _prompt_ids(hf, MESSAGES)
    finished = 0
    for seed in range(3):
        resp = _ask(client, server, tool_choice=NAMED, max_tokens=80, temperature=1.0,
                    seed=seed)
        want = reference.generate({"prompt_token_ids": ids}, SamplingParams(
            temperature=1.0, seed=seed, max_tokens=80,
            structured_outputs=StructuredOutputsParams(json=WEATHER)))[0].outputs[0]
        assert resp.usage.prompt_tokens == len(ids)
        choice = resp.choices[0]
        assert choice.message.content == ""
        [call] = choice.message.tool_calls
        assert (call.type, call.function.name) == ("function", "get_weather")
        assert call.id.startswith("chatcmpl-tool-")
        assert call.function.arguments == want.text
        assert choice.finish_reason == want.finish_reason  # a named call keeps "stop"
        if choice.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert finished >= 1


def _required_against_reference(client, server, reference, hf, max_items=None, **kwargs):
    """"required" answers (n=3) next to the engine's under the calls schema."""
    ids = _prompt_ids(hf, MESSAGES)
    resp = _ask(client, server, tool_choice="required", max_tokens=300, temperature=1.0, seed=3,
                n=3, **kwargs)
    wants = reference.generate({"prompt_token_ids": ids}, SamplingParams(
        temperature=1.0, seed=3, max_tokens=300, n=3, structured_outputs=StructuredOutputsParams(
            json=calls_schema(TOOLS, max_items))))[0].outputs
    for choice, want in zip(resp.choices, wants):
        assert choice.message.content == ""
        check_required_calls(_calls(choice.message), want.text, want.finish_reason)
        for name, arguments in _calls(choice.message)[:len(whole_elements(want.text)[0])]:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        # "required" ends with "tool_calls" where the engine stopped; a cut
        # answer keeps "length" (with the calls it finished).
        assert choice.finish_reason == ("tool_calls" if want.finish_reason == "stop"
                                        else want.finish_reason)
    return resp, wants


def test_required_calls_are_the_elements_of_the_engines_array(
        client, server, reference, hf):
    resp, wants = _required_against_reference(client, server, reference, hf)
    # One answer is cut inside a call: it keeps the call as far as it came.
    assert any(len(c.message.tool_calls or []) > len(whole_elements(w.text)[0])
               for c, w in zip(resp.choices, wants, strict=True))
    call_ids = [c.id for choice in resp.choices for c in choice.message.tool_calls or []]
    assert len(set(call_ids)) == len(call_ids) >= 3
    assert all(i.startswith("chatcmpl-tool-") for i in call_ids)
    assert max(len(choice.message.tool_calls or []) for choice in resp.choices) >= 2


def test_parallel_tool_calls_false_makes_one_call(client, server, reference, hf):
    resp, wants = _required_against_reference(client, server, reference, hf, max_items=1,
                                               parallel_tool_calls=False)
    assert [w.finish_reason for w in wants].count("stop") >= 2
    for choice in resp.choices:
        assert len(choice.message.tool_calls) == 1


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_streamed_calls_reassemble_to_the_whole_answer(client, server, tool_choice):
    """The client's stream helper rebuilds from the deltas the calls the
    whole answer has (ids aside: each answer makes its own)."""
    kwargs = dict(model=server.model_dir, messages=MESSAGES, tools=TOOLS,
                  tool_choice=tool_choice, max_tokens=300, temperature=1.0, seed=7, n=2,
                  parallel_tool_calls=False)
    whole = client.chat.completions.create(**kwargs)
    with client.chat.completions.stream(**kwargs) as stream:
        events = list(stream)
        streamed = stream.get_final_completion()
    assert any(e.type == "tool_calls.function.arguments.done" for e in events)
    for got, want in zip(streamed.choices, whole.choices):
        assert got.finish_reason == want.finish_reason
        assert _calls(got.message) == _calls(want.message)
        assert got.message.tool_calls and all(
            c.id.startswith("chatcmpl-tool-") for c in got.message.tool_calls)


def test_several_streamed_calls_reassemble_at_their_indices(client, server):
    """Calls of an answer cut at max_tokens, rebuilt by the client's stream
    accumulator (its final parse refuses a "length" answer): the whole
    answer's calls, several to a choice."""
    from openai.lib.streaming.chat import ChatCompletionStreamState

    kwargs = dict(model=server.model_dir, messages=MESSAGES, tools=TOOLS,
                  tool_choice="required", max_tokens=300, temperature=1.0, seed=7, n=2)
    whole = client.chat.completions.create(**kwargs)
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        state.handle_chunk(chunk)
    streamed = state.current_completion_snapshot
    for got, want in zip(streamed.choices, whole.choices):
        assert got.finish_reason == want.finish_reason == "length"
        assert _calls(got.message) == _calls(want.message)
    assert max(len(c.message.tool_calls) for c in streamed.choices) >= 2


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_arguments_stream_in_pieces_that_join_into_the_whole_answers(client, server,
                                                                      tool_choice):
    """A forced call's deltas as they come: its first entry (id, type,
    name), then its arguments in many pieces, joining, call by call, into
    the whole answer's (ids aside: each answer makes its own)."""
    body = {"model": server.model_dir, "messages": MESSAGES, "tools": TOOLS,
            "tool_choice": tool_choice, "max_tokens": 300, "temperature": 1.0, "seed": 7}
    whole = client.chat.completions.create(**body)
    deltas = streamed_chat_deltas(server.url, {**body, "stream": True})
    entries = [e for d in deltas for e in d.get("tool_calls", [])]
    calls = assembled(entries)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
        _calls(whole.choices[0].message)
    assert all(c["id"].startswith("chatcmpl-tool-") for c in calls)
    assert len(argument_pieces(entries, 0)) > 5
    assert not any(d.get("content") for d in deltas)


def test_a_named_calls_first_delta_names_it_and_the_rest_add_arguments(server):
    body = {"model": server.model_dir, "messages": MESSAGES, "tools": TOOLS,
            "tool_choice": NAMED, "max_tokens": 80, "temperature": 1.0, "seed": 0,
            "stream": True}
    deltas = streamed_chat_deltas(server.url, body)
    entries = [e for d in deltas for e in d.get("tool_calls", [])]
    first, rest = entries[0], entries[1:]
    assert first["index"] == 0 and first["type"] == "function"
    assert first["id"].startswith("chatcmpl-tool-")
    assert first["function"]["name"] == "get_weather"
    assert all(e == {"index": 0, "function": {"arguments": e["function"]["arguments"]}}
               for e in rest)
    assert not any(d.get("content") for d in deltas)


def test_a_conversation_with_calls_and_answers_renders_as_transformers(
        client, server, reference, hf):
    """Earlier calls (arguments as JSON text, content null) and the tools'
    answers reach the template as transformers gives them (arguments as
    objects, content ""); with tool_choice "none" the answer is plain."""
    messages = [*MESSAGES,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather",
                                  "arguments": '{"city": "Oslo", "days": 2}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Snow, then sun."}]
    as_templates_read = copy.deepcopy(messages)
    as_templates_read[1]["content"] = ""
    as_templates_read[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Oslo", "days": 2}
    ids = _prompt_ids(hf, as_templates_read)
    resp = client.chat.completions.create(model=server.model_dir, messages=messages,
                                          tools=TOOLS, tool_choice="none", max_tokens=12,
                                          temperature=0)
    want = reference.generate({"prompt_token_ids": ids},
                              SamplingParams(temperature=0.0, max_tokens=12))[0].outputs[0]
    assert resp.usage.prompt_tokens == len(ids)
    assert resp.choices[0].message.content == want.text
    assert not resp.choices[0].message.tool_calls
    tokenized = httpx.post(f"{server.url}/tokenize", json={
        "messages": messages, "tools": TOOLS}, timeout=60).json()
    assert tokenized["tokens"] == ids


def _error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert "Traceback" not in error["message"] and "\n" not in error["message"]
    return error


BAD_SCHEMA_TOOL = {"type": "function", "function": {"name": "f",
                                                    "parameters": {"type": "strnig"}}}


@pytest.mark.parametrize("fields, param, message", [
    ({"tools": TOOLS}, "tool_choice", "--enable-auto-tool-choice --tool-call-parser NAME"),
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice", "needs a tool-call parser"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tool_choice": NAMED}, "tool_choice", "needs tools"),
    ({"tools": [], "tool_choice": "none"}, "tools", "must not be empty"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}},
     "tool_choice.function.name", "'fly', which is not among tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.function",
     "named tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "got 'sometimes'"),
    ({"tools": [{"type": "function"}], "tool_choice": "none"}, "tools.0.function", "required"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
      "tool_choice": "none"}, "tools.0.function.parameters", "dictionary"),
    ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "required"}, "tools.1.function.name",
     "two tools are named 'get_weather'"),
    ({"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_object"}},
     None, "one constraint per request"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a+"}, None,
     "one constraint per request"),
    ({"functions": [TOOLS[2]["function"]]}, "functions", "send tools"),
    ({"function_call": "auto"}, "function_call", "send tool_choice"),
    ({"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "now", "arguments": "{oops"}}]}]},
     "messages.1.tool_calls.0.function.arguments", "arguments must be JSON text"),
    ({"tools": [BAD_SCHEMA_TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     None, "invalid JSON schema"),
])
def test_bad_tools_and_choices_are_400_naming_the_field(server, client, fields, param, message):
    body = {"model": server.model_dir, "messages": MESSAGES, "max_tokens": 8, **fields}
    error = _error(httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60))
    assert message in error["message"], error
    assert error["param"] == param, error
    # The server goes on serving, tool calls too.
    resp = _ask(client, server, tool_choice={"type": "function", "function": {"name": "now"}},
                max_tokens=16, temperature=0)
    assert resp.choices[0].message.tool_calls[0].function.name == "now"


def _deep_tool(depth: int) -> dict:
    """A tool whose parameters nest ``depth`` levels: ``{}`` inside
    ``depth - 1`` "items"."""
    parameters: dict = {}
    for _ in range(depth - 1):
        parameters = {"items": parameters}
    return {"type": "function", "function": {"name": "deep", "parameters": parameters}}


def test_tools_nested_past_a_schemas_bound_are_400_naming_tools(server, client, hf):
    """Parameters nested 125 levels (one past what a structured-outputs
    schema may nest, 124) are refused on every route that renders tools,
    before anything walks them: chat (tool choice "none" or naming it),
    Responses (its flat tool) and /tokenize; 124 levels are served."""
    deep = _deep_tool(125)
    flat = {"type": "function", "name": "deep", **{
        k: v for k, v in deep["function"].items() if k != "name"}}
    named = {"type": "function", "function": {"name": "deep"}}
    asks = [("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "tools": [deep],
                                      "tool_choice": "none"}),
            ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "tools": [deep],
                                      "tool_choice": named}),
            ("/v1/responses", {"input": "Hi", "max_output_tokens": 4, "tools": [flat],
                               "tool_choice": "none"}),
            ("/tokenize", {"messages": MESSAGES, "tools": [deep]})]
    for path, fields in asks:
        body = {"model": server.model_dir, **fields}
        error = _error(httpx.post(f"{server.url}{path}", json=body, timeout=60))
        assert error["param"] == "tools", (path, error)
        assert "tools.0 nests objects and arrays more than 126 levels" in error["message"]
    served = client.chat.completions.create(model=server.model_dir, messages=MESSAGES,
                                            tools=[_deep_tool(124)], tool_choice="none",
                                            max_tokens=2)
    assert served.usage.prompt_tokens == len(_prompt_ids(hf, MESSAGES, [_deep_tool(124)]))


def test_a_text_response_format_is_no_second_constraint(client, server):
    resp = _ask(client, server, tool_choice={"type": "function", "function": {"name": "now"}},
                response_format={"type": "text"}, max_tokens=16, temperature=0)
    [(name, arguments)] = _calls(resp.choices[0].message)
    assert (name, json.loads(arguments)) == ("now", {})


def test_the_client_sees_auto_refused_with_the_reason(client, server):
    with pytest.raises(openai.BadRequestError, match="tool-call parser"):
        _ask(client, server, max_tokens=4)
