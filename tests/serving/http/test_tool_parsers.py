"""The tool-call parsers of tool_choice "auto" on hand-written model
outputs: each text's expected content and calls are written out by hand
from the parser's rule (``serving/http/tool_parsers.py``), and the same
text fed in pieces of every size must give the same message, with the
stream's deltas adding up to it."""

from __future__ import annotations

import json
import re

import pytest

from serving.http.tool_parsers import TOOL_CALL_PARSERS

WEATHER = {"city": "Oslo", "days": 2}

# (text, content, [(name, arguments)]) for llama3_json
LLAMA = [
    ("The weather is fine.", "The weather is fine.", []),
    ("", "", []),
    ('{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}', None,
     [("get_weather", WEATHER)]),
    ('{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}', None,
     [("get_weather", WEATHER)]),
    ('  \n<|python_tag|>{"name": "now", "parameters": {}}', None, [("now", {})]),
    ('<|python_tag|> {"name":"get_weather","parameters":{"city":"Oslo","days":2}} ;\n'
     '{"name": "now", "arguments": {"note": "a;b {c}\\" }"}};{"name": "now", '
     '"parameters": {"u": "é😀"}}', None,
     [("get_weather", WEATHER), ("now", {"note": 'a;b {c}" }'}), ("now", {"u": "é😀"})]),
    ('{"name": "now", "parameters": {}}; ', None, [("now", {})]),
    ('{"name": "now", "parameters": {}} Done.', "Done.", [("now", {})]),
    # Not a call at the start: all content, call-shaped text later included.
    ('Sure: {"name": "now", "parameters": {}}', 'Sure: {"name": "now", "parameters": {}}', []),
    ('<|python_tag|>print(1)', '<|python_tag|>print(1)', []),
    ('<|python', '<|python', []),
    # Malformed or not a call: all content, as written.
    ('{"name": "now", "parameters": {}', '{"name": "now", "parameters": {}', []),
    ('{"name": now, "parameters": {}}', '{"name": now, "parameters": {}}', []),
    ('{"name": "now"}', '{"name": "now"}', []),
    ('{"city": "Oslo"}', '{"city": "Oslo"}', []),
    ('{"name": 7, "parameters": {}}', '{"name": 7, "parameters": {}}', []),
    # The run ends at the first object that is not a call.
    ('{"name": "now", "parameters": {}}; {"name": "get_weather", "parameters": {"ci',
     '{"name": "get_weather", "parameters": {"ci', [("now", {})]),
    ('{"name": "now", "parameters": {}} {"name": "now", "parameters": {}}',
     '{"name": "now", "parameters": {}}', [("now", {})]),
]

# (text, content, [(name, arguments)]) for hermes
HERMES = [
    ("Nothing to call here.", "Nothing to call here.", []),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
     '</tool_call>', None, [("get_weather", WEATHER)]),
    ('Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", '
     '"days": 2}}</tool_call>\n<tool_call>{"name": "now", "arguments": {"tz": "<tool_call>"}}'
     '</tool_call>\n', "Let me check.\n",
     [("get_weather", WEATHER), ("now", {"tz": "<tool_call>"})]),
    ('<tool_call>{"name": "now", "arguments": {}}', None, [("now", {})]),
    ('<tool_call>{"name": "now", "arguments": {}}</tool_call> All set.', "All set.",
     [("now", {})]),
    ("x < y and <tool", "x < y and <tool", []),
    # Malformed or not a call: all content, as written.
    ('<tool_call>{"name": "now", "arguments": {}</tool_call>',
     '<tool_call>{"name": "now", "arguments": {}</tool_call>', []),
    ('Hi <tool_call>{"name": "now", "parameters": {}}</tool_call>',
     'Hi <tool_call>{"name": "now", "parameters": {}}</tool_call>', []),
    ('<tool_call>{"name": "now", "arguments": {"a": 1', '<tool_call>{"name": "now", '
     '"arguments": {"a": 1', []),
    # The run ends at the first block that is not a call.
    ('A<tool_call>{"name": "now", "arguments": {}}</tool_call><tool_call>oops</tool_call>',
     "A<tool_call>oops</tool_call>", [("now", {})]),
]


# (text, content, [(name, arguments)]) for pythonic
PYTHONIC = [
    ("The weather is fine.", "The weather is fine.", []),
    ('[get_weather(city="Oslo", days=2)]', None, [("get_weather", WEATHER)]),
    ('[get_weather(city="Oslo", days=2), now()]', None, [("get_weather", WEATHER), ("now", {})]),
    # Nested literals, signs, None/True/False, single quotes, brackets and
    # quotes inside strings, a triple-quoted string, a comment, line breaks.
    ("[search(q=['a', {'k': [1, -2.5, +3]}], opts={\"n\": None, 'on': True, 1: False}),\n"
     " say(text='It\\'s \"(]\" ok', more=\"a\\nb)]\", long='''x)]\n'''),\n"
     " now(  # all of it)]\n)]", None,
     [("search", {"q": ["a", {"k": [1, -2.5, 3]}], "opts": {"n": None, "on": True, "1": False}}),
      ("say", {"text": "It's \"(]\" ok", "more": "a\nb)]", "long": "x)]\n"}), ("now", {})]),
    ('  [ now() , now(u="é😀"), ]  ', None, [("now", {}), ("now", {"u": "é😀"})]),
    ("[say(a=\"\", b='', c=\"\"\"q\"\"\", d='''''')]", None,
     [("say", {"a": "", "b": "", "c": "q", "d": ""})]),
    ("[now()] Done.", "Done.", [("now", {})]),
    ("[now()]\n", None, [("now", {})]),
    ("[now()", None, [("now", {})]),  # cut after a call: the call stays
    # Not a list of calls at the start: all content, call-shaped text later included.
    ("Sure: [now()]", "Sure: [now()]", []),
    ("[1] is a citation", "[1] is a citation", []),
    ("[]", "[]", []),
    ("[", "[", []),
    # Malformed or not a call: all content, as written.
    ("[now(]", "[now(]", []),
    ("[now(", "[now(", []),
    ('[get_weather("Oslo")]', '[get_weather("Oslo")]', []),
    ("[get_weather(city=oslo)]", "[get_weather(city=oslo)]", []),
    ("[get_weather(city=('Oslo', 'Bergen'))]", "[get_weather(city=('Oslo', 'Bergen'))]", []),
    ("[get_weather(city={'Oslo'})]", "[get_weather(city={'Oslo'})]", []),
    ("[get_weather(city=b'Oslo')]", "[get_weather(city=b'Oslo')]", []),
    ("[get_weather(days=1e999)]", "[get_weather(days=1e999)]", []),
    ("[get_weather(**where)]", "[get_weather(**where)]", []),
    ("[get_weather(days=1, days=2)]", "[get_weather(days=1, days=2)]", []),
    ("[weather.get(city='Oslo')]", "[weather.get(city='Oslo')]", []),
    ("[now().isoformat()]", "[now().isoformat()]", []),
    ("[now()(1)]", "[now()(1)]", []),
    ("[now() now()]", "[now() now()]", []),
    ("[say(text='a\nb')]", "[say(text='a\nb')]", []),
    # The run ends at the first element that is not a call.
    ("[now(), get_weather(city=oslo)]", "get_weather(city=oslo)]", [("now", {})]),
    ('[now(), get_weather(city="Oslo"', 'get_weather(city="Oslo"', [("now", {})]),
    ("[now(), 7]", "7]", [("now", {})]),
    ("[now()]]", "]", [("now", {})]),
]

# (text, content, [(name, arguments)]) for mistral
MISTRAL = [
    ("This is a test", "This is a test", []),
    # The older form: one token, then a JSON list.
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]', None,
     [("get_weather", WEATHER)]),
    ('Let me check. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo", '
     '"days": 2}}, {"arguments": {"note": "[TOOL_CALLS] ]}\\""}, "name": "now"}]\nDone.',
     "Let me check. Done.", [("get_weather", WEATHER), ("now", {"note": '[TOOL_CALLS] ]}"'})]),
    ('[TOOL_CALLS][{"name": "now"}]', None, [("now", {})]),
    ('[TOOL_CALLS][{"name": "now", "arguments": {}},', None, [("now", {})]),
    # The newer form: a token before each call, a name, [ARGS] or not, an object.
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 2}[TOOL_CALLS]now[ARGS]{}', None,
     [("get_weather", WEATHER), ("now", {})]),
    ('hi{hi[TOOL_CALLS]bash{"command": "print(\\"[ARGS]{\\")", "n": [1, {"k": null}]}', "hi{hi",
     [("bash", {"command": 'print("[ARGS]{")', "n": [1, {"k": None}]})]),
    ('[TOOL_CALLS] now [ARGS] {} \n[TOOL_CALLS] [{"name": "now", "arguments": {"u": "é😀"}}] ok',
     "ok", [("now", {}), ("now", {"u": "é😀"})]),
    ("x < [TOOL", "x < [TOOL", []),
    # Malformed or not a call: content from the token on, as written.
    ("[TOOL_CALLS]toolname_no_args", "[TOOL_CALLS]toolname_no_args", []),
    ("[TOOL_CALLS] not json at all", "[TOOL_CALLS] not json at all", []),
    ("Hm [TOOL_CALLS][]", "Hm [TOOL_CALLS][]", []),
    ("[TOOL_CALLS]", "[TOOL_CALLS]", []),
    ('[TOOL_CALLS]bash{"command": "ls"', '[TOOL_CALLS]bash{"command": "ls"', []),
    ('[TOOL_CALLS]bash{"command": "ls",}', '[TOOL_CALLS]bash{"command": "ls",}', []),
    ('[TOOL_CALLS][{"arguments": {}}]', '[TOOL_CALLS][{"arguments": {}}]', []),
    ('[TOOL_CALLS][{"name": 7, "arguments": {}}]', '[TOOL_CALLS][{"name": 7, "arguments": {}}]',
     []),
    # The run ends at the first piece that is not a call.
    ('[TOOL_CALLS]now{}[TOOL_CALLS]bash{"a": ', '[TOOL_CALLS]bash{"a": ', [("now", {})]),
    ('[TOOL_CALLS][{"name": "now", "arguments": {}}, {"name": 1}]', '{"name": 1}]',
     [("now", {})]),
    ('[TOOL_CALLS]now{} {"name": "now"}', '{"name": "now"}', [("now", {})]),
]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _read(parser: str, text: str, size: int) -> tuple[dict, list[dict]]:
    reader = TOOL_CALL_PARSERS[parser]()
    pieces = _pieces(text, size)
    deltas = [reader.delta(piece, last=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    return reader.message(), deltas, reader


def _named(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def _valid_id(parser: str, call_id: str) -> bool:
    """Mistral's ids are 9 letters and digits (its chat templates take no
    other); the other parsers' are vLLM's ``chatcmpl-tool-`` ids."""
    if parser == "mistral":
        return re.fullmatch(r"[A-Za-z0-9]{9}", call_id) is not None
    return re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", call_id) is not None


@pytest.mark.parametrize("parser, text, content, calls",
                         [("llama3_json", *case) for case in LLAMA]
                         + [("hermes", *case) for case in HERMES]
                         + [("pythonic", *case) for case in PYTHONIC]
                         + [("mistral", *case) for case in MISTRAL])
def test_each_text_reads_as_its_rule_says_in_pieces_of_every_size(parser, text, content, calls):
    for size in range(1, max(len(text), 1) + 1):
        message, deltas, reader = _read(parser, text, size)
        assert message["content"] == content, size
        assert _named(message.get("tool_calls", [])) == calls, size
        if not calls:
            assert message == {"content": text}
            assert reader.finish_reason("stop") == "stop"
        else:
            assert reader.finish_reason("stop") == "tool_calls"
            assert reader.finish_reason("length") == "length"
        # The stream: content as it comes, each call whole in one entry,
        # at its index, with the id the message gives it.
        streamed = "".join(d.get("content", "") for d in deltas)
        assert streamed == (content or "")
        entries = [e for d in deltas for e in d.get("tool_calls", [])]
        assert [e["index"] for e in entries] == list(range(len(calls)))
        assert [{k: v for k, v in e.items() if k != "index"} for e in entries] == \
            message.get("tool_calls", [])
        ids = [c["id"] for c in message.get("tool_calls", [])]
        assert len(set(ids)) == len(ids) and all(_valid_id(parser, i) for i in ids)


def test_arguments_are_the_json_text_of_the_object_given():
    text = '{"name": "say", "parameters": {"text": "héllo", "n": [1, 2.5, null]}}'
    message, _, _ = _read("llama3_json", text, len(text))
    [call] = message["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["arguments"] == '{"text": "héllo", "n": [1, 2.5, null]}'


def test_content_is_held_only_while_it_may_start_a_call():
    """hermes sends text up to a possible ``<tool_call>`` at once; llama3_json
    decides at the first character that is not blank."""
    hermes = TOOL_CALL_PARSERS["hermes"]()
    assert hermes.delta("Hello <tool") == {"content": "Hello "}
    assert hermes.delta("box>") == {"content": "<toolbox>"}
    llama = TOOL_CALL_PARSERS["llama3_json"]()
    assert llama.delta("  ") == {}
    assert llama.delta("Hi") == {"content": "  Hi"}
    assert llama.delta(" there", last=True) == {"content": " there"}
    call = TOOL_CALL_PARSERS["llama3_json"]()
    assert call.delta('{"name": "now", "parameters": {') == {}
    [entry] = call.delta("}}")["tool_calls"]
    assert entry["function"] == {"name": "now", "arguments": "{}"}


def test_pythonic_and_mistral_let_out_what_is_settled():
    """pythonic holds the answer from its ``[`` on and sends a call once its
    element has ended (``now()`` may still go on as ``now()(1)``); text
    that does not start with a list goes out at once. mistral sends text
    up to a possible ``[TOOL_CALLS]`` at once, and a call when its
    arguments' object closes."""
    pythonic = TOOL_CALL_PARSERS["pythonic"]()
    assert pythonic.delta(" ") == {}
    assert pythonic.delta("[now(") == {}
    assert pythonic.delta(")") == {}
    [entry] = pythonic.delta(", ")["tool_calls"]
    assert (entry["index"], entry["function"]) == (0, {"name": "now", "arguments": "{}"})
    assert pythonic.delta('say(text="])")') == {}
    [entry] = pythonic.delta("]")["tool_calls"]
    assert (entry["index"], entry["function"]) == (1, {"name": "say",
                                                       "arguments": '{"text": "])"}'})
    assert pythonic.delta(" Done", last=True) == {"content": "Done"}
    plain = TOOL_CALL_PARSERS["pythonic"]()
    assert plain.delta("Hi [") == {"content": "Hi ["}
    mistral = TOOL_CALL_PARSERS["mistral"]()
    assert mistral.delta("Sure [TOOL") == {"content": "Sure "}
    assert mistral.delta("_CALLS]now[AR") == {}
    assert mistral.delta('GS]{"a": "}"') == {}
    [entry] = mistral.delta("}")["tool_calls"]
    assert entry["function"] == {"name": "now", "arguments": '{"a": "}"}'}
    assert mistral.delta("", last=True) == {}
