"""tool_choice "auto" over HTTP, driven by the official ``openai`` client,
on ``tiny`` (with a tool-use chat template) served with
``--enable-auto-tool-choice --tool-call-parser NAME``.

``tiny``'s free text is random, so the answers under test are forced with
the engine's structured outputs: "auto" adds no constraint of its own, so
a request's ``guided_regex`` holds its output as it would without tools,
here to exactly one known text. Mistral's ``[TOOL_CALLS]`` and ``[ARGS]``
are special tokens (here added to tiny's tokenizer), which no regex over
text reaches: its answers are forced with a grammar that names them by id
(``<[259]>``). The expected content and calls are written out by hand
from the parser's rule for that text. An unforced answer is checked
against the same request with tool_choice "none" (same prompt, same
seed): "auto" generates freely, and text without calls is content."""

from __future__ import annotations

import json
import re

import pytest

from checkpoint.tiny_model import TINY_NAME
from serving.http.tool_parsers import TOOL_CALL_PARSERS
from tests.helpers.http_utils import (
    openai_client,
    serving_tiny_with_tools,
    streamed_chat_deltas,
)
from tests.helpers.proc_utils import run_tprun
from tests.helpers.tool_stream import argument_pieces, assembled
from tests.helpers.tool_template import MISTRAL_TOKENS

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "days": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now"}}]
MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]
TWO_CALLS = [("get_weather", {"city": "Oslo", "days": 2}), ("now", {})]
TOOL_CALLS, ARGS = MISTRAL_TOKENS["[TOOL_CALLS]"], MISTRAL_TOKENS["[ARGS]"]


def literal(text: str) -> str:
    """A regex that matches ``text`` and nothing else."""
    return "".join("\\n" if c == "\n" else "\\" + c if c in "\\.+*?()|[]{}^$" else c
                   for c in text)


def lark(*parts: str | int) -> str:
    """A grammar of exactly ``parts`` in a row: texts, and tokens by id."""
    return "start: " + " ".join(f"<[{p}]>" if isinstance(p, int) else json.dumps(p)
                                for p in parts)


# case: (its server's fixture, the text its answer is forced to (a tuple: texts
# and token ids), (content, calls))
FORCED = {
    "hermes": ("hermes", 'Checking.\n<tool_call>{"name": "get_weather", "arguments": '
               '{"city": "Oslo", "days": 2}}</tool_call>\n<tool_call>{"name": "now", '
               '"arguments": {}}</tool_call>', ("Checking.\n", TWO_CALLS)),
    "llama": ("llama", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", '
              '"days": 2}}; {"name": "now", "arguments": {}}', (None, TWO_CALLS)),
    "pythonic": ("pythonic", '[get_weather(city="Oslo", days=2), now()]', (None, TWO_CALLS)),
    "mistral": ("mistral", ("Checking.", TOOL_CALLS, "get_weather", ARGS,
                            '{"city": "Oslo", "days": 2}', TOOL_CALLS, "now", ARGS, "{}"),
                ("Checking.", TWO_CALLS)),
    "mistral_list": ("mistral", (TOOL_CALLS, ' [{"name": "get_weather", "arguments": {"city": '
                                 '"Oslo", "days": 2}}, {"name": "now", "arguments": {}}]'),
                     (None, TWO_CALLS)),
    "qwen3_coder": ("qwen3_coder", "Checking.\n<tool_call>\n<function=get_weather>\n"
                    "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
                    "</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n"
                    "</tool_call>", ("Checking.\n", TWO_CALLS)),
}
PLAIN = "It is sunny in Oslo {today}."


def _served(tmp_path_factory, parser: str, **kwargs):
    with serving_tiny_with_tools(tmp_path_factory.mktemp(parser), "--enable-auto-tool-choice",
                                 "--tool-call-parser", parser, **kwargs) as served:
        yield served


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    yield from _served(tmp_path_factory, "hermes")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    yield from _served(tmp_path_factory, "llama3_json")


@pytest.fixture(scope="module")
def pythonic(tmp_path_factory):
    yield from _served(tmp_path_factory, "pythonic")


@pytest.fixture(scope="module")
def qwen3_coder(tmp_path_factory):
    yield from _served(tmp_path_factory, "qwen3_coder")


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    yield from _served(tmp_path_factory, "mistral", special_tokens=MISTRAL_TOKENS)


def _kwargs(server, **fields) -> dict:
    return dict(model=server.model_dir, messages=MESSAGES, tools=TOOLS, max_tokens=200,
                temperature=1.0, seed=5, **fields)


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def _forcing(text: str | tuple) -> dict:
    """The body fields that force ``text`` (a tuple: texts and token ids)."""
    if isinstance(text, tuple):
        return {"guided_grammar": lark(*text)}
    return {"guided_regex": literal(text)}


def _forced(server, text: str | tuple, **fields) -> dict:
    return _kwargs(server, extra_body=_forcing(text), **fields)


def _valid_id(which: str, call_id: str) -> bool:
    """Mistral's ids are 9 letters and digits; the others vLLM's."""
    pattern = r"[A-Za-z0-9]{9}" if which == "mistral" else r"chatcmpl-tool-[0-9a-f]{32}"
    return re.fullmatch(pattern, call_id) is not None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(FORCED))
@pytest.mark.parametrize("tool_choice", ["auto", None])  # None: the default with tools
def test_forced_calls_come_back_as_the_parser_reads_them(request, case, tool_choice):
    which, text, want = FORCED[case]
    server = request.getfixturevalue(which)
    fields = {} if tool_choice is None else {"tool_choice": tool_choice}
    with openai_client(server) as client:
        resp = client.chat.completions.create(**_forced(server, text, **fields))
    choice = resp.choices[0]
    assert (choice.message.content, _calls(choice.message)) == want
    assert choice.finish_reason == "tool_calls"
    ids = [c.id for c in choice.message.tool_calls]
    assert len(set(ids)) == 2 and all(_valid_id(which, i) for i in ids)
    assert all(c.type == "function" for c in choice.message.tool_calls)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("which, text", [(w, t) for w, t, _ in FORCED.values()]
                         + [(w, PLAIN) for w in ("hermes", "llama", "pythonic", "mistral")])
def test_a_streamed_answer_reassembles_to_the_whole_one(request, which, text):
    server = request.getfixturevalue(which)
    kwargs = _forced(server, text, n=2)
    with openai_client(server) as client:
        whole = client.chat.completions.create(**kwargs)
        with client.chat.completions.stream(**kwargs) as stream:
            events = list(stream)
            streamed = stream.get_final_completion()
    for got, want in zip(streamed.choices, whole.choices, strict=True):
        assert got.finish_reason == want.finish_reason
        # A stream's content starts as "" where the whole answer has None.
        assert (got.message.content or "") == (want.message.content or "")
        assert _calls(got.message) == _calls(want.message)
    if text == PLAIN:
        assert all(c.message.content == PLAIN and not c.message.tool_calls
                   and c.finish_reason == "stop" for c in whole.choices)
    else:
        assert any(e.type == "tool_calls.function.arguments.done" for e in events)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["hermes", "llama"])
def test_parallel_tool_calls_false_keeps_the_first_call(request, case):
    """As vLLM filters them: with ``parallel_tool_calls`` false an "auto"
    answer has its first call alone, whole and streamed (no delta of
    another call), its content as it is; a Responses answer likewise has
    one function_call item."""
    which, text, want = FORCED[case]
    server = request.getfixturevalue(which)
    kwargs = _forced(server, text, parallel_tool_calls=False)
    with openai_client(server) as client:
        whole = client.chat.completions.create(**kwargs)
        with client.chat.completions.stream(**kwargs) as stream:
            list(stream)
            streamed = stream.get_final_completion()
        response = client.responses.create(
            model=server.model_dir, input=MESSAGES[0]["content"], max_output_tokens=200,
            parallel_tool_calls=False,
            tools=[{"type": "function", "name": t["function"]["name"],
                    "parameters": t["function"].get("parameters")} for t in TOOLS],
            extra_body={"structured_outputs": {"regex": literal(text)}})
    for choice in (whole.choices[0], streamed.choices[0]):
        assert (choice.message.content or None, _calls(choice.message)) == (want[0],
                                                                            want[1][:1])
        assert choice.finish_reason == "tool_calls"
    body = {k: v for k, v in kwargs.items() if k != "extra_body"}
    deltas = streamed_chat_deltas(server.url, {**body, **kwargs["extra_body"], "stream": True})
    assert {e["index"] for d in deltas for e in d.get("tool_calls", [])} == {0}
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == want[1][:1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["hermes", "llama", "mistral", "mistral_list", "pythonic",
                                  "qwen3_coder"])
def test_each_calls_arguments_stream_in_pieces(request, case):
    """The deltas as they come: each call's first entry (index, id, type,
    name), then its arguments in pieces (get_weather's in several deltas;
    qwen3_coder's a parameter at a time), adding up, call by call and with
    the same content, to the whole answer to the same request."""
    which, text, (content, calls) = FORCED[case]
    server = request.getfixturevalue(which)
    body = {**_kwargs(server), **_forcing(text)}
    with openai_client(server) as client:
        whole = client.chat.completions.create(**_forced(server, text)).choices[0].message
    deltas = streamed_chat_deltas(server.url, {**body, "stream": True})
    entries = [e for d in deltas for e in d.get("tool_calls", [])]
    streamed = assembled(entries)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in streamed] == \
        [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed] \
        == calls
    assert all(_valid_id(which, c["id"]) for c in streamed)
    assert "".join(d.get("content") or "" for d in deltas) == (content or "")
    # A delta's entries of one call are one entry: a piece per delta.
    assert len(argument_pieces(entries, 0)) > (3 if case == "qwen3_coder" else 5)


@pytest.mark.timeout(300)
def test_mistral_reads_its_token_shown_whatever_skip_special_tokens_says(mistral):
    """Mistral's call token is a special token: the text a request gets
    leaves it out unless it asks (``skip_special_tokens`` false), but the
    mistral parser reads the text with it shown, as vLLM's asks for it."""
    _, text, want = FORCED["mistral"]
    with openai_client(mistral) as client:
        none = client.chat.completions.create(**_forced(mistral, text, tool_choice="none"))
        shown = client.chat.completions.create(**_kwargs(
            mistral, tool_choice="none",
            extra_body={**_forcing(text), "skip_special_tokens": False}))
        auto = client.chat.completions.create(**_kwargs(
            mistral, tool_choice="auto",
            extra_body={**_forcing(text), "skip_special_tokens": True}))
    assert none.choices[0].message.content == 'Checking.get_weather{"city": "Oslo", "days": 2}now{}'
    assert shown.choices[0].message.content == ('Checking.[TOOL_CALLS]get_weather[ARGS]{"city": '
                                                '"Oslo", "days": 2}[TOOL_CALLS]now[ARGS]{}')
    assert (auto.choices[0].message.content, _calls(auto.choices[0].message)) == want


@pytest.mark.timeout(300)
def test_mistral_calls_on_the_responses_route(mistral):
    """The Responses API reads "auto" with the same parser, the special
    tokens shown for it: the content is a message, the calls function_call
    items after it (their ``call_id`` the Responses API's own, as vLLM's)."""
    _, text, (content, calls) = FORCED["mistral"]
    flat = [{"type": "function", **tool["function"]} for tool in TOOLS]
    with openai_client(mistral) as client:
        response = client.responses.create(
            model=mistral.model_dir, input="Weather in Oslo?", tools=flat,
            max_output_tokens=200, extra_body={"structured_outputs": {"grammar": lark(*text)}})
    assert [item.type for item in response.output] == ["message", "function_call",
                                                       "function_call"]
    assert response.output[0].content[0].text == content
    items = response.output[1:]
    assert [(item.name, json.loads(item.arguments)) for item in items] == calls


@pytest.mark.timeout(300)
@pytest.mark.parametrize("which, parser", [("hermes", "hermes"), ("llama", "llama3_json"),
                                           ("pythonic", "pythonic"), ("mistral", "mistral")])
def test_a_free_answer_is_read_from_the_text_none_gives(request, which, parser):
    """Unforced, "auto" samples what tool_choice "none" samples (same
    prompt and seed); its message is what the parser makes of that text
    (with special tokens shown for hermes and mistral, as their "auto"
    shows them, vLLM's parsers asking so)."""
    server = request.getfixturevalue(which)
    shown = {"skip_special_tokens": False} if parser in ("hermes", "mistral") else {}
    with openai_client(server) as client:
        plain = client.chat.completions.create(**_kwargs(server, tool_choice="none", n=2,
                                                         extra_body=shown))
        auto = client.chat.completions.create(**_kwargs(server, tool_choice="auto", n=2))
    for got, text in zip(auto.choices, plain.choices, strict=True):
        reader = TOOL_CALL_PARSERS[parser]()
        reader.delta(text.message.content, last=True)
        want = reader.message()
        assert got.message.content == want["content"]
        assert _calls(got.message) == [(c["function"]["name"], json.loads(c["function"]
                                        ["arguments"])) for c in want.get("tool_calls", [])]
        assert got.finish_reason == reader.finish_reason(text.finish_reason)
    assert auto.usage.completion_tokens == plain.usage.completion_tokens


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flags, message", [
    (["--http-port", "0", "--enable-auto-tool-choice"],
     "--enable-auto-tool-choice needs --tool-call-parser (llama3_json, hermes, pythonic, "
     "mistral, qwen3_coder)"),
    (["--http-port", "0", "--enable-auto-tool-choice", "--tool-call-parser", "granite"],
     "--tool-call-parser must be one of llama3_json, hermes, pythonic, mistral, qwen3_coder, "
     "got 'granite'"),
    (["--http-port", "0", "--tool-call-parser", "hermes"],
     "--tool-call-parser needs --enable-auto-tool-choice"),
    (["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
     "--enable-auto-tool-choice needs --http-port"),
])
def test_tool_parser_flags_are_checked_before_anything_starts(tmp_path, flags, message):
    env = {"TPRUN_CACHE": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    result, leftovers = run_tprun(["serve", "--device", "cpu", *flags], timeout=100, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"tprun: error: {message}"]
    assert leftovers == []
    assert not (tmp_path / TINY_NAME).exists()  # refused before the model was written
