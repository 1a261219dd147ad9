"""OpenAI's Responses API (``POST /v1/responses``) on ``tiny``, driven by the
official ``openai`` client. The reference for every answer is the same
conversation through ``client.chat.completions.create`` (greedy: equal
text, equal token counts, and with ``include`` logprobs the chat's
logprobs, whole and streamed); a streamed answer's deltas join into the
whole answer, its events come in the documented order with sequence
numbers from 0, ending in the event the response's status names
(``response.incomplete`` when ``max_output_tokens`` cut it, as OpenAI
sends), and the client's stream helper accepts them; answers and
events validate as the ``openai`` package's types; a ``json_schema``
``text.format`` gives JSON the schema validates; fields the server does
not serve, and bad tools, tool choices and input items, are 400s naming
them (function tools themselves: ``test_http_responses_tools.py``). The
response store is off by default, as vLLM's: ``previous_response_id`` is
then a 404, and so are its other routes, with the same error; on
(``--enable-responses-api-store``), a stored response is retrieved as it
was answered (background responses: ``test_http_responses_background.py``;
without the store ``background`` is a 400 saying how to turn it on),
continues as the chat of its conversation, without its
instructions, lists its input items as OpenAI lists them (hand-written
expectations, the ``openai`` package's item types, the client's own
paging), and once deleted is unknown to every route and to
``previous_response_id``; the store's bounds count the input items. The
API key, the body guards and the metrics hold for the route as for the
others."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import (
    ResponseInputMessageItem,
    ResponseItemList,
    ResponseOutputMessage,
)

from serving.http.protocol import ResponsesRequest
from serving.http.response_store import ResponseStore
from serving.http.serving_responses import check_context
from tests.helpers.http_utils import (
    metric,
    openai_client,
    serving_think_model,
    serving_tiny,
    typed_responses,
)
from tests.helpers.think_model import END_THINK

pytestmark = pytest.mark.timeout(180)

KEY = "responses-key-7c1d"
LOGPROBS = "message.output_text.logprobs"
WEATHER_TOOL = {"type": "function", "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5},
                   "size": {"enum": ["S", "M", "L"]}},
    "required": ["name", "size"],
    "additionalProperties": False,
}
EVENT_ORDER_HEAD = ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added"]
EVENT_ORDER_TAIL = ["response.output_text.done", "response.content_part.done",
                    "response.output_item.done"]
TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats") as served:
        yield served


@pytest.fixture(scope="module")
def stored_server(tmp_path_factory):
    """A server with the response store on and an API key."""
    with serving_tiny(tmp_path_factory.mktemp("http"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats", "--enable-responses-api-store",
                      "--api-key", KEY) as served:
        yield served


@pytest.fixture(scope="module")
def stored_client(stored_server):
    with openai_client(stored_server, KEY) as c:
        yield c


def _chat(client, messages, max_tokens=12, **extra):
    answer = client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                            max_tokens=max_tokens, extra_body=extra or None)
    return answer.choices[0], answer.usage


def _status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


@pytest.mark.parametrize("instructions", [None, "Answer in one word."])
def test_text_input_is_the_chat_answer(client, instructions):
    response = client.responses.create(model="tiny", input="Name a color.", temperature=0,
                                       max_output_tokens=12, instructions=instructions)
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + [
        {"role": "user", "content": "Name a color."}]
    choice, usage = _chat(client, messages)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == choice.message.content
    assert [item.type for item in response.output] == ["message"]
    assert response.output[0].role == "assistant"
    assert [part.type for part in response.output[0].content] == ["output_text"]
    assert response.status == _status(choice.finish_reason)
    assert (response.usage.input_tokens, response.usage.output_tokens,
            response.usage.total_tokens) == (usage.prompt_tokens, usage.completion_tokens,
                                             usage.total_tokens)
    assert response.instructions == instructions and response.model == "tiny"


def test_message_items_are_the_chat_messages(client):
    items = [{"role": "system", "content": "Be brief."},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "Hello"},
                          {"type": "input_text", "text": "there"}]},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Hi!", "annotations": []}]},
             {"role": "user", "content": "And now?"}]
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                             {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": "Hi!"},
                {"role": "user", "content": "And now?"}]
    response = client.responses.create(model="tiny", input=items, temperature=0,
                                       max_output_tokens=12)
    choice, usage = _chat(client, messages)
    assert response.output_text == choice.message.content
    assert response.usage.input_tokens == usage.prompt_tokens


def test_stream_deltas_join_into_the_whole_answer(client):
    ask = dict(model="tiny", input="Tell me a story.", temperature=0, max_output_tokens=16)
    whole = client.responses.create(**ask)
    events = list(client.responses.create(**ask, stream=True))
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == EVENT_ORDER_HEAD + ["response.output_text.delta"] * deltas + \
        EVENT_ORDER_TAIL + [TERMINAL[whole.status]]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[-4].text == text  # response.output_text.done
    final = events[-1].response
    assert final.output_text == text and final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert {events[2].item.id, events[3].item_id, events[-2].item.id,
            final.output[0].id} == {final.output[0].id}
    with client.responses.stream(**ask) as stream:  # the client's own checks of the events
        helped = list(stream)
    assert helped[-1].type == TERMINAL[whole.status]
    assert helped[-1].response.output_text == text


@pytest.mark.parametrize("fields", [
    {"max_output_tokens": 3, "metadata": {"k": "v"}, "instructions": "Be brief.",
     "ignore_eos": True},
    {"max_output_tokens": 40, "temperature": 0, "text": {"format": {"type": "json_object"}}},
    {"max_output_tokens": 3, "text": {"format": {"type": "json_schema", "name": "s",
                                                 "schema": {"type": "string"}}}},
    {"max_output_tokens": 4, "include": [LOGPROBS], "top_logprobs": 2},
])
def test_the_answer_validates_as_the_openai_packages_types(server, fields):
    """The whole answer is a ``Response`` and each streamed event a
    ``ResponseStreamEvent`` of the ``openai`` package, validated with every
    required field (the client itself reads them leniently)."""
    whole, events = typed_responses(server.url, {"model": "tiny", "input": "Hi", **fields})
    assert events[0].type == "response.created"
    assert events[-1].type == TERMINAL[events[-1].response.status]
    if fields.get("ignore_eos"):  # cut at max_output_tokens, whole and streamed
        assert whole.status == events[-1].response.status == "incomplete"
    assert [e.type for e in events if e.type.endswith(".delta")]
    if "include" in fields:
        assert len(whole.output[0].content[0].logprobs) == whole.usage.output_tokens
        assert any(e.logprobs for e in events if e.type == "response.output_text.delta")


def _chat_logprobs(client, max_tokens: int, top: int, **extra) -> tuple[str, list]:
    answer = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Name a color."}], temperature=0,
        max_tokens=max_tokens, logprobs=True, top_logprobs=top, extra_body=extra or None)
    return answer.choices[0].message.content, answer.choices[0].logprobs.content


def _same_logprobs(got, want, with_bytes: bool = True) -> None:
    """Entries equal as tokens, values (to float noise) and, where given, bytes."""
    assert [e.token for e in got] == [e.token for e in want]
    assert [e.logprob for e in got] == pytest.approx([e.logprob for e in want], abs=1e-5)
    for g, w in zip(got, want):
        assert [t.token for t in g.top_logprobs] == [t.token for t in w.top_logprobs]
        assert [t.logprob for t in g.top_logprobs] == pytest.approx(
            [t.logprob for t in w.top_logprobs], abs=1e-5)
        if with_bytes:
            assert g.bytes == w.bytes
            assert [t.bytes for t in g.top_logprobs] == [t.bytes for t in w.top_logprobs]


@pytest.mark.parametrize("top, extra", [(3, {}), (None, {}), (2, {"stop": ["e"]})])
def test_output_text_logprobs_are_the_chats(client, top, extra):
    """``include: ["message.output_text.logprobs"]`` gives the output text
    the logprobs the chat gives the same greedy request (``top_logprobs``
    alternatives; unset: none), whole; streamed, the deltas' logprobs
    joined are those, and the done events hold them all. A stop string cuts
    the text, not the logprobs of the tokens that came (as in the chat)."""
    ask = dict(model="tiny", input="Name a color.", temperature=0, max_output_tokens=10,
               include=[LOGPROBS], extra_body=extra or None)
    if top is not None:
        ask["top_logprobs"] = top
    text, want = _chat_logprobs(client, 10, top or 0, **extra)
    response = client.responses.create(**ask)
    part = response.output[0].content[0]
    assert part.text == text
    assert len(want) == response.usage.output_tokens and all(
        len(e.top_logprobs) == (top or 0) for e in want)
    _same_logprobs(part.logprobs, want)
    assert response.top_logprobs == (top or 0)
    events = list(client.responses.create(**ask, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    _same_logprobs([lp for e in deltas for lp in e.logprobs], want, with_bytes=False)
    assert "".join(e.delta for e in deltas) == text
    [done] = [e for e in events if e.type == "response.output_text.done"]
    _same_logprobs(done.logprobs, want, with_bytes=False)
    [part_done] = [e for e in events if e.type == "response.content_part.done"]
    _same_logprobs(part_done.part.logprobs, want)
    _same_logprobs(events[-1].response.output[0].content[0].logprobs, want)


@pytest.fixture(scope="module")
def think_client(tmp_path_factory):
    """The official client of a server of ``tiny`` with ``<think>``/``</think>``
    under ``--reasoning-parser deepseek_r1`` (an answer begins inside its
    reasoning)."""
    with serving_think_model(tmp_path_factory.mktemp("think"), "--reasoning-parser",
                             "deepseek_r1") as served, openai_client(served) as c:
        yield served.model_dir, c


def test_output_text_logprobs_after_a_reasoning_are_its_answers_tokens(think_client):
    """An answer that begins inside its reasoning: ``output_text`` holds
    the logprobs of the tokens after ``</think>`` alone, the chat's entries
    for those tokens (the same seeded request: the chat lists every output
    token's, reasoning and tag too), whole and streamed; the reasoning item
    and its events carry none. ``tiny`` writes ``</think>`` only with a
    ``logit_bias`` helping it: the first seed whose answer has reasoning,
    the tag and at least two answer tokens is the case."""
    model, client = think_client
    bias = {str(END_THINK): 3.0}
    for seed in range(64):
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Two and two?"}], max_tokens=12,
            temperature=1.0, seed=seed, logit_bias=bias, logprobs=True, top_logprobs=2,
            extra_body={"return_token_ids": True}).choices[0]
        ids = chat.model_extra["token_ids"]
        if END_THINK in ids[1:-2]:
            break
    else:
        pytest.fail("no seed made an answer after a reasoning")
    want = chat.logprobs.content[ids.index(END_THINK) + 1:]
    ask = dict(model=model, input="Two and two?", max_output_tokens=12, include=[LOGPROBS],
               top_logprobs=2, temperature=1.0, extra_body={"seed": seed, "logit_bias": bias})
    whole = client.responses.create(**ask)
    assert [item.type for item in whole.output] == ["reasoning", "message"]
    assert whole.output[0].content[0].text == chat.message.reasoning
    part = whole.output[1].content[0]
    assert part.text == chat.message.content
    _same_logprobs(part.logprobs, want)
    events = list(client.responses.create(**ask, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    _same_logprobs([lp for e in deltas for lp in e.logprobs], want, with_bytes=False)
    [done] = [e for e in events if e.type == "response.output_text.done"]
    _same_logprobs(done.logprobs, want, with_bytes=False)
    _same_logprobs(events[-1].response.output[1].content[0].logprobs, want)
    assert all("logprobs" not in e.model_dump() for e in events
               if e.type.startswith("response.reasoning_text"))


def test_without_include_there_are_no_logprobs(client):
    """As in vLLM, ``top_logprobs`` alone asks for nothing; the ``include``
    values vLLM takes that name parts of items this server never makes are
    accepted and change nothing."""
    ask = dict(model="tiny", input="Name a color.", temperature=0, max_output_tokens=6)
    plain = client.responses.create(**ask)
    alone = client.responses.create(**ask, top_logprobs=3)
    others = client.responses.create(**ask, include=["reasoning.encrypted_content",
                                                     "file_search_call.results"])
    for response in (plain, alone, others):
        assert response.output_text == plain.output_text
        assert response.output[0].content[0].logprobs == []
    assert alone.top_logprobs == 3


def test_max_output_tokens_makes_it_incomplete(client):
    ask = dict(model="tiny", input="Count to ten.", temperature=0,
               extra_body={"ignore_eos": True})
    short = client.responses.create(**ask, max_output_tokens=4)
    longer = client.responses.create(**ask, max_output_tokens=12)
    choice, usage = _chat(client, [{"role": "user", "content": "Count to ten."}], max_tokens=4,
                          ignore_eos=True)
    assert short.status == "incomplete"
    assert short.incomplete_details.reason == "max_output_tokens"
    assert short.output[0].status == "incomplete"
    assert short.usage.output_tokens == 4 == usage.completion_tokens
    assert short.max_output_tokens == 4
    assert short.output_text == choice.message.content
    assert longer.output_text.startswith(short.output_text)
    streamed = list(client.responses.create(**ask, max_output_tokens=4, stream=True))
    kinds = [event.type for event in streamed]
    assert kinds[-1] == "response.incomplete" and "response.completed" not in kinds
    assert streamed[-1].response.status == "incomplete"
    assert streamed[-1].response.incomplete_details.reason == "max_output_tokens"
    assert streamed[-1].response.output_text == short.output_text
    assert streamed[-2].item.status == "incomplete"  # response.output_item.done


def test_a_finished_stream_ends_with_response_completed(client):
    """An answer the model ends itself (here: one of two choices, then its
    end) is "completed", whole and streamed, and the client's stream
    helper gives it as its final response."""
    ask = dict(model="tiny", input="Name a color.", temperature=0, max_output_tokens=32,
               extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    whole = client.responses.create(**ask)
    assert whole.status == "completed" and whole.output_text in ("red", "blue")
    kinds = [event.type for event in client.responses.create(**ask, stream=True)]
    assert kinds[-1] == "response.completed" and "response.incomplete" not in kinds
    with client.responses.stream(**ask) as stream:
        assert stream.get_final_response().output_text == whole.output_text


def test_json_schema_format_gives_valid_json(client):
    fmt = {"type": "json_schema", "name": "box", "schema": SCHEMA, "strict": True}
    for seed in range(3):
        response = client.responses.create(
            model="tiny", input="Describe a box.", max_output_tokens=150, temperature=1.0,
            text={"format": fmt}, extra_body={"seed": seed})
        assert response.status == "completed", response.output_text
        jsonschema.validate(json.loads(response.output_text), SCHEMA)
        assert response.text.format.type == "json_schema"
        choice = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Describe a box."}],
            max_tokens=150, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {
                "name": "box", "schema": SCHEMA, "strict": True}}).choices[0]
        assert response.output_text == choice.message.content
    response = client.responses.create(model="tiny", input="{", max_output_tokens=40,
                                       temperature=0, text={"format": {"type": "json_object"}})
    choice, _ = _chat(client, [{"role": "user", "content": "{"}], max_tokens=40,
                      response_format={"type": "json_object"})
    assert response.output_text == choice.message.content
    assert response.output_text.lstrip().startswith("{")


@pytest.mark.parametrize("extra", [
    {"logit_bias": {"65": 100}},
    {"logit_bias": {"65": 100}, "stop": ["A"], "include_stop_str_in_output": True},
    {"structured_outputs": {"regex": "[a-c]{5}"}},
    {"structured_outputs": {"choice": ["red", "blue"]}},
])
def test_vllms_other_fields_act_as_on_the_chat(client, extra):
    """vLLM's Responses fields beside the sampling ones (``logit_bias``,
    ``include_stop_str_in_output``, ``structured_outputs``) give the chat's
    answer with the same fields, which differs from the answer without."""
    ask = dict(model="tiny", input="Name a color.", temperature=0, max_output_tokens=8)
    response = client.responses.create(**ask, extra_body=extra)
    choice, _ = _chat(client, [{"role": "user", "content": "Name a color."}], max_tokens=8,
                      **extra)
    assert response.output_text == choice.message.content
    assert response.output_text != client.responses.create(**ask).output_text


@pytest.mark.parametrize("fields, param", [
    ({"extra_body": {"structured_outputs": {"regex": "a"}},
      "text": {"format": {"type": "json_object"}}}, "structured_outputs"),
    ({"extra_body": {"logit_bias": {"x": 1}}}, "logit_bias"),
    ({"tools": [WEATHER_TOOL]}, "tool_choice"),  # "auto" needs a tool-call parser
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "description": "no name"}], "tool_choice": "none"},
     "tools.0.name"),
    ({"tools": [WEATHER_TOOL, WEATHER_TOOL], "tool_choice": "required"}, "tools.1.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function"}}, "tool_choice.name"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "fly"}},
     "tool_choice.name"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "get_weather"},
      "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"background": True}, "background"),
    ({"include": [LOGPROBS, "web_search_call.results"]}, "include.1"),
    ({"top_logprobs": -2}, "top_logprobs"),  # -1 is the whole vocabulary
    ({"truncation": "middle"}, "truncation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),  # vLLM refuses it too
    ({"conversation": "conv_1"}, "conversation"),
    ({"context_management": [{"type": "compaction", "compact_threshold": 1000}]},
     "context_management"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]},
     "input.0.encrypted_content"),
    ({"input": [{"type": "reasoning", "summary": [{"type": "text", "text": "x"}]}]},
     "input.0.summary.0"),
    ({"input": [{"type": "reasoning", "summary": [],
                 "content": [{"type": "output_text", "text": "x"}]}]}, "input.0.content.0"),
    ({"input": [{"type": "computer_call"}]}, "input.0.type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]},
     "input.0.arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input.0.output"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input.0.output.0.type"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input.0.content.0.type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
])
def test_unserved_and_bad_fields_are_400_naming_them(server, client, fields, param):
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(**body)
    assert raised.value.param == param
    assert param.split(".")[0] in raised.value.message
    assert client.responses.create(model="tiny", input="hi", max_output_tokens=2).output_text \
        is not None  # the server goes on serving


@pytest.mark.parametrize("fields, param", [
    ({"max_output_tokens": 5000}, "max_output_tokens"),
    ({"max_output_tokens": 10**30}, "max_output_tokens"),
    ({"input": "a" * 5000}, "input"),
    ({"instructions": "a" * 5000}, "input"),
])
def test_what_does_not_fit_the_context_is_named_by_this_apis_fields(client, fields, param):
    """Too long for the model's context (tiny's: 4096 tokens): OpenAI's
    code, with this API's field named, not the engine's max_tokens."""
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(**body)
    assert raised.value.param == param
    assert raised.value.code == "context_length_exceeded"
    assert param in raised.value.message and "max_tokens" not in raised.value.message
    assert "4096" in raised.value.message


@pytest.mark.parametrize("given, engine_max, num_input, message, param", [
    # Hand-worked against max_model_len 16.
    (None, None, 16, "the input (16 tokens) leaves no room for output in max_model_len 16, "
                     "this model's maximum context length", "input"),
    (2, 2, 20, "the input (20 tokens) leaves no room for output in max_model_len 16, "
               "this model's maximum context length", "input"),
    (9, 9, 10, "input (10 tokens) + max_output_tokens (9) = 19 exceeds max_model_len 16, "
               "this model's maximum context length", "max_output_tokens"),
    # Under a recommended cap of 8 the engine would run 8 (10 + 8 > 16): the
    # message shows what the client asked for.
    (50, 8, 10, "input (10 tokens) + max_output_tokens (50) = 60 exceeds max_model_len 16, "
                "this model's maximum context length", "max_output_tokens"),
])
def test_the_context_error_names_this_apis_fields_word_for_word(given, engine_max, num_input,
                                                               message, param):
    request = ResponsesRequest(model="tiny", input="hi", max_output_tokens=given)
    with pytest.raises(ValueError) as raised:
        check_context(request, num_input, engine_max, 16)
    assert (str(raised.value), raised.value.param, raised.value.code) == \
        (message, param, "context_length_exceeded")


@pytest.mark.parametrize("given, engine_max, num_input", [
    (None, None, 15),  # one token of room, and the engine fills it
    (6, 6, 10),  # 16: fits
    (50, 6, 10),  # the recommended cap (6) is what the engine runs, and it fits
])
def test_what_fits_the_context_passes(given, engine_max, num_input):
    request = ResponsesRequest(model="tiny", input="hi", max_output_tokens=given)
    check_context(request, num_input, engine_max, 16)


def test_without_the_store_previous_response_id_is_404(server, client):
    first = client.responses.create(model="tiny", input="Hi", max_output_tokens=2)
    assert first.store is False
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model="tiny", input="More", previous_response_id=first.id)
    assert raised.value.param == "previous_response_id" and first.id in raised.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(first.id)


def test_without_the_store_background_is_a_400_saying_how_to_turn_it_on(server, client):
    """As vLLM's: a background response needs the store, so the error
    names ``background`` and the flag that turns the store on."""
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model="tiny", input="hi", max_output_tokens=2,
                                    background=True, stream=stream)
        assert raised.value.param == "background"
        assert "--enable-responses-api-store" in raised.value.message
    assert client.responses.create(model="tiny", input="hi", max_output_tokens=2,
                                   background=False).background is False


def test_without_the_store_every_stored_response_route_gives_the_gets_404(server):
    """Retrieve, delete, list input items and cancel: one error, OpenAI's
    shape, saying how to turn the store on."""
    url = f"{server.url}/v1/responses/resp_0123"
    answers = [httpx.get(url, timeout=60), httpx.delete(url, timeout=60),
               httpx.get(f"{url}/input_items", params={"order": "asc"}, timeout=60),
               httpx.post(f"{url}/cancel", timeout=60)]
    assert [answer.status_code for answer in answers] == [404] * 4
    error = answers[0].json()["error"]
    assert all(answer.json() == {"error": error} for answer in answers)
    assert error["type"] == "invalid_request_error" and "resp_0123" in error["message"]
    assert "--enable-responses-api-store" in error["message"]


def test_a_stored_response_is_retrieved_as_answered(stored_client):
    first = stored_client.responses.create(model="tiny", input="Hi", max_output_tokens=6,
                                           temperature=0, metadata={"topic": "greeting"})
    assert first.store is True
    again = stored_client.responses.retrieve(first.id)
    assert again.model_dump() == first.model_dump()
    events = list(stored_client.responses.create(model="tiny", input="Hey",
                                                 max_output_tokens=6, stream=True))
    streamed = events[-1].response
    assert stored_client.responses.retrieve(streamed.id).model_dump() == streamed.model_dump()
    for store in (False, None):  # null stores nothing either, as vLLM reads it
        unstored = stored_client.responses.create(model="tiny", input="Hi",
                                                  max_output_tokens=2, store=store)
        assert unstored.store is False
        with pytest.raises(openai.NotFoundError):
            stored_client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError, match="background"):
        stored_client.responses.cancel(first.id)
    with pytest.raises(openai.NotFoundError):
        stored_client.responses.cancel("resp_unknown")


def test_previous_response_id_continues_the_conversation(stored_client):
    first = stored_client.responses.create(model="tiny", input="Hi", temperature=0,
                                           max_output_tokens=6, instructions="Be kind.")
    second = stored_client.responses.create(model="tiny", input="Go on.", temperature=0,
                                            max_output_tokens=8,
                                            previous_response_id=first.id)
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "Go on."}]
    choice, usage = _chat(stored_client, history, max_tokens=8)  # instructions not carried
    assert second.output_text == choice.message.content
    assert second.usage.input_tokens == usage.prompt_tokens
    assert second.previous_response_id == first.id
    third = stored_client.responses.create(model="tiny", input="Again.", temperature=0,
                                           max_output_tokens=8, instructions="Be terse.",
                                           previous_response_id=second.id)
    history += [{"role": "assistant", "content": second.output_text},
                {"role": "user", "content": "Again."}]
    choice, _ = _chat(stored_client, [{"role": "system", "content": "Be terse."}, *history],
                      max_tokens=8)
    assert third.output_text == choice.message.content


def test_key_guards_and_metrics_hold_for_the_route(stored_server, stored_client):
    url = f"{stored_server.url}/v1/responses"
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 3}
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(url, json=body, timeout=60).status_code == 401
    assert httpx.get(f"{url}/resp_x", timeout=60).status_code == 401
    sent_as_text = httpx.post(url, content=json.dumps(body), timeout=60,
                              headers={**auth, "Content-Type": "text/plain"})
    assert sent_as_text.status_code == 415
    too_large = httpx.post(url, content=b"{" + b" " * (9 << 20) + b"}", timeout=60,
                           headers={**auth, "Content-Type": "application/json"})
    assert too_large.status_code == 413
    malformed = httpx.post(url, content=b'{"input": ', timeout=60,
                           headers={**auth, "Content-Type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == \
        "invalid_request_error"
    names = ("tprun:request_success_total", "tprun:time_to_first_token_seconds_count",
             "tprun:generation_tokens_total")
    before = {name: metric(stored_server.url, name) for name in names}
    response = stored_client.responses.create(**body, extra_body={"ignore_eos": True})
    after = {name: metric(stored_server.url, name) - before[name] for name in names}
    assert response.usage.output_tokens == 3
    assert after == {"tprun:request_success_total": 1,
                     "tprun:time_to_first_token_seconds_count": 1,
                     "tprun:generation_tokens_total": 3}


def _auth_get(server, path: str, **params) -> dict:
    answer = httpx.get(f"{server.url}/v1/responses/{path}", params=params, timeout=60,
                       headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _texts(item) -> tuple:
    return item.type, item.role, [(part.type, part.text) for part in item.content]


GIVEN_INPUT = [
    {"role": "system", "content": "Be brief."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"},
                                                    {"type": "output_text", "text": "there"}]},
    {"type": "message", "role": "assistant", "id": "msg_given", "status": "completed",
     "content": [{"type": "output_text", "text": "Hi!", "annotations": []}]},
    {"role": "user", "content": "And now?"},
]
GIVEN_ITEMS = [  # GIVEN_INPUT as OpenAI lists it: the request's form of each, by hand
    ("message", "system", [("input_text", "Be brief.")]),
    ("message", "user", [("input_text", "Hello"), ("input_text", "there")]),
    ("message", "assistant", [("output_text", "Hi!")]),
    ("message", "user", [("input_text", "And now?")]),
]


def test_input_items_are_the_context_as_openai_lists_it(stored_server, stored_client):
    """The request's input items (not its instructions), each one of the
    ``openai`` package's item types; after ``previous_response_id`` that
    response's input items and its output come first, as answered."""
    first = stored_client.responses.create(model="tiny", input=GIVEN_INPUT, temperature=0,
                                           instructions="Be kind.", max_output_tokens=4)
    page = stored_client.responses.input_items.list(first.id, order="asc")
    assert [_texts(item) for item in page.data] == GIVEN_ITEMS
    assert page.data[2].id == "msg_given" and len({item.id for item in page.data}) == 4
    assert page.has_more is False
    newest_first = stored_client.responses.input_items.list(first.id)  # OpenAI's default
    assert [item.id for item in newest_first.data] == [item.id for item in page.data][::-1]
    raw = _auth_get(stored_server, f"{first.id}/input_items", order="asc")
    listed = ResponseItemList.model_validate(raw)  # every required field, strictly
    assert (listed.first_id, listed.last_id) == (page.data[0].id, page.data[-1].id)
    for item, (_, role, _) in zip(raw["data"], GIVEN_ITEMS):
        kind = ResponseOutputMessage if role == "assistant" else ResponseInputMessageItem
        assert kind.model_validate(item).status == "completed"

    second = stored_client.responses.create(model="tiny", input="Go on.", temperature=0,
                                            max_output_tokens=4, previous_response_id=first.id)
    chain = stored_client.responses.input_items.list(second.id, order="asc").data
    assert [item.id for item in chain[:5]] == [item.id for item in page.data] + [
        first.output[0].id]
    assert chain[4].model_dump() == first.output[0].model_dump()  # the answer as answered
    assert _texts(chain[5]) == ("message", "user", [("input_text", "Go on.")])
    for item in _auth_get(stored_server, f"{second.id}/input_items", order="asc")["data"]:
        kind = ResponseOutputMessage if item["role"] == "assistant" else \
            ResponseInputMessageItem
        kind.model_validate(item)


def test_input_items_page_as_openai_pages_them(stored_client):
    """``limit`` items ``after`` an id, ``has_more`` while some are left,
    in either order; the client's own paging (``after`` the last id) walks
    them all."""
    first = stored_client.responses.create(model="tiny", input=GIVEN_INPUT,
                                           max_output_tokens=2)
    second = stored_client.responses.create(model="tiny", input="Go on.", max_output_tokens=2,
                                            previous_response_id=first.id)
    listing = stored_client.responses.input_items.list
    ids = [item.id for item in listing(second.id, order="asc").data]
    assert len(ids) == 6  # four given, the first answer, "Go on."
    pages = [listing(second.id, order="asc", limit=2, **after)
             for after in ({}, {"after": ids[1]}, {"after": ids[3]})]
    assert [[item.id for item in p.data] for p in pages] == [ids[:2], ids[2:4], ids[4:]]
    assert [p.has_more for p in pages] == [True, True, False]
    newest = listing(second.id, limit=4)
    assert [item.id for item in newest.data] == ids[::-1][:4] and newest.has_more is True
    assert [item.id for item in listing(second.id, order="asc", limit=1)] == ids
    assert [item.id for item in listing(second.id, limit=5)] == ids[::-1]
    past_the_end = listing(second.id, order="asc", after=ids[-1])
    assert past_the_end.data == [] and past_the_end.has_more is False


def test_input_items_show_earlier_logprobs_where_include_asks(stored_server, stored_client):
    first = stored_client.responses.create(model="tiny", input="Name a color.", temperature=0,
                                           max_output_tokens=4, include=[LOGPROBS],
                                           top_logprobs=2)
    second = stored_client.responses.create(model="tiny", input="More.", max_output_tokens=2,
                                            previous_response_id=first.id)
    asked = stored_client.responses.input_items.list(second.id, order="asc",
                                                     include=[LOGPROBS]).data
    plain = stored_client.responses.input_items.list(second.id, order="asc").data
    want = first.output[0].content[0]
    assert len(want.logprobs) == 4 and all(len(e.top_logprobs) == 2 for e in want.logprobs)
    assert asked[1].id == plain[1].id == first.output[0].id
    assert asked[1].content[0].model_dump() == want.model_dump()
    assert plain[1].content[0].text == want.text and plain[1].content[0].logprobs == []
    spelled = _auth_get(stored_server, f"{second.id}/input_items", order="asc",
                        include=LOGPROBS)  # as include=..., not the client's include[]=...
    assert len(spelled["data"][1]["content"][0]["logprobs"]) == 4


@pytest.mark.parametrize("query, param", [
    ({"limit": 0}, "limit"),
    ({"limit": 101}, "limit"),
    ({"extra_query": {"limit": "ten"}}, "limit"),
    ({"extra_query": {"limit": "\u00b2"}}, "limit"),  # a digit to str.isdigit, not to int
    ({"extra_query": {"limit": "9" * 5000}}, "limit"),  # past int()'s digits
    ({"order": "up"}, "order"),
    ({"after": "msg_not_there"}, "after"),
    ({"include": [LOGPROBS, "web_search_call.results"]}, "include.1"),
])
def test_bad_input_item_queries_are_400_naming_them(stored_client, query, param):
    response = stored_client.responses.create(model="tiny", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as raised:
        stored_client.responses.input_items.list(response.id, **query)
    assert raised.value.param == param and param.split(".")[0] in raised.value.message
    assert stored_client.responses.input_items.list(response.id).data  # still served


def test_a_deleted_response_is_unknown_everywhere(stored_server, stored_client):
    """OpenAI's answer to a delete (the client returns None); then the id
    is a 404 to every route and to ``previous_response_id``, while a
    response that continued it before keeps its own context."""
    first = stored_client.responses.create(model="tiny", input="Hi", temperature=0,
                                           max_output_tokens=4)
    second = stored_client.responses.create(model="tiny", input="Go on.", temperature=0,
                                            max_output_tokens=4, previous_response_id=first.id)
    deleted = stored_client.responses.with_raw_response.delete(first.id)
    assert deleted.status_code == 200
    assert deleted.http_response.json() == {"id": first.id, "object": "response.deleted",
                                            "deleted": True}
    assert deleted.parse() is None
    gone = [lambda: stored_client.responses.retrieve(first.id),
            lambda: stored_client.responses.delete(first.id),
            lambda: stored_client.responses.input_items.list(first.id),
            lambda: stored_client.responses.cancel(first.id)]
    for call in gone:
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        assert first.id in raised.value.message
        assert raised.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as raised:
        stored_client.responses.create(model="tiny", input="More", max_output_tokens=2,
                                       previous_response_id=first.id)
    assert raised.value.param == "previous_response_id"
    assert stored_client.responses.retrieve(second.id).model_dump() == second.model_dump()
    kept = stored_client.responses.input_items.list(second.id, order="asc").data
    assert [item.id for item in kept][1] == first.output[0].id
    third = stored_client.responses.create(model="tiny", input="Again.", temperature=0,
                                           max_output_tokens=4, previous_response_id=second.id)
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "Go on."},
               {"role": "assistant", "content": second.output_text},
               {"role": "user", "content": "Again."}]
    choice, _ = _chat(stored_client, history, max_tokens=4)
    assert third.output_text == choice.message.content
    with pytest.raises(openai.NotFoundError):
        stored_client.responses.delete("resp_never_made")


def _entry(name: str, item_chars: int) -> tuple:
    """A small body and conversation, with input items of about
    ``item_chars`` characters."""
    body = {"id": f"resp_{name}", "object": "response", "status": "completed", "output": []}
    item = {"id": f"msg_{name}", "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "x" * item_chars}]}
    return body, [{"role": "user", "content": "x"}], [item]


def test_the_stores_bounds_count_input_items():
    """Two entries whose bodies and conversations fit 2,000 characters but
    whose input items do not: the older is dropped. Deleting gives back
    every character; the newest 2 of 3 are kept under a bound of 2."""
    store = ResponseStore(max_responses=10, max_chars=2000)
    store.put(*_entry("a", 1200))
    assert store.get("resp_a") is not None and store.chars > 1200
    store.put(*_entry("b", 1200))
    assert store.get("resp_a") is None and store.get("resp_b").input_items[0]["id"] == "msg_b"
    assert store.delete("resp_b") is not None and store.delete("resp_b") is None
    assert (store.chars, len(store.entries)) == (0, 0)
    store = ResponseStore(max_responses=2)
    for name in "cde":
        store.put(*_entry(name, 10))
    assert list(store.entries) == ["resp_d", "resp_e"]
    store.delete("resp_d")
    store.put(*_entry("f", 10))
    assert list(store.entries) == ["resp_e", "resp_f"]
