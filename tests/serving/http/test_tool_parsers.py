"""The tool-call parsers of tool_choice "auto" on hand-written model
outputs: each text's expected content and calls are written out by hand
from the parser's rule (``serving/http/tool_parsers.py``), and the same
text fed in pieces of every size, and split in two at every character,
must give the same message, with the stream's deltas adding up to it (a
call's arguments in pieces, ``tests/helpers/tool_stream.py``). What a
stream holds back is checked against hand-worked prefixes."""

from __future__ import annotations

import ast
import json
import re

import pytest

from serving.http.tool_parsers import TOOL_CALL_PARSERS
from tests.helpers.tool_stream import argument_pieces, assembled, splits

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
    # Cut in a call once its name and arguments began: the call stays, its
    # arguments as far as they came.
    ('{"name": "now", "parameters": {}', None, [("now", {})]),
    ('{"name": "say", "parameters": {"n": 12', None, [("say", '{"n": 12')]),
    # Malformed or not a call: all content, as written.
    ('{"name": "now", "parameters": ', '{"name": "now", "parameters": ', []),
    ('{"name": now, "parameters": {}}', '{"name": now, "parameters": {}}', []),
    ('{"name": "now"}', '{"name": "now"}', []),
    ('{"city": "Oslo"}', '{"city": "Oslo"}', []),
    ('{"name": 7, "parameters": {}}', '{"name": 7, "parameters": {}}', []),
    # The run ends at the first object that is not a call, or where a
    # call's JSON breaks off.
    ('{"name": "now", "parameters": {}}; {"name": "get_weather", "parameters": {"ci',
     None, [("now", {}), ("get_weather", '{"ci')]),
    ('{"name": "now", "parameters": {}}; {"name": "get_weather"}',
     '{"name": "get_weather"}', [("now", {})]),
    ('{"name": "say", "parameters": {"a": 1 "b": 2}} Done.', '"b": 2}} Done.',
     [("say", '{"a": 1')]),
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
    # The arguments given in whichever order, keys given twice (the first
    # counts), other keys and blank space; what follows a call's object up
    # to the block's end tag is the block's.
    ('<tool_call>\n{"arguments": {"u": "\\u00e9\\ud83d\\ude00\\n"}, "id": [1], "name": "now", '
     '"name": "x", "arguments": 5}\n</tool_call>', None, [("now", {"u": "é😀\n"})]),
    ('<tool_call>{"name": "now", "arguments": {}}}</tool_call>', None, [("now", {})]),
    ('<tool_call>{"name": "now", "arguments": {}</tool_call>', None, [("now", {})]),
    ('<tool_call>{"name": "f", "arguments": {"a": tru}}</tool_call>ok', "ok",
     [("f", '{"a": ')]),
    # Cut in a call: the call stays, its arguments as far as they came.
    ('<tool_call>{"name": "now", "arguments": {"a": 1', None, [("now", '{"a": 1')]),
    ('<tool_call>{"name": "now", "arguments": {"a": "x\\u00', None, [("now", '{"a": "x')]),
    # Malformed or not a call: all content, as written.
    ('Hi <tool_call>{"name": "now", "parameters": {}}</tool_call>',
     'Hi <tool_call>{"name": "now", "parameters": {}}</tool_call>', []),
    ('<tool_call>{"name": "now", "arguments"', '<tool_call>{"name": "now", "arguments"', []),
    ('<tool_call>{"name": ["now"], "arguments": {}}</tool_call>',
     '<tool_call>{"name": ["now"], "arguments": {}}</tool_call>', []),
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
    # Cut in a call once its first value began: the call stays, its
    # arguments as far as they came.
    ('[now(), get_weather(city="Oslo"', None, [("now", {}), ("get_weather", '{"city": "Oslo"')]),
    ("[say(n=12, text='ab", None, [("say", '{"n": 12, "text": "ab')]),
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
    ("[get_weather(city={'Oslo'})]", "})]", [("get_weather", '{"city": {"Oslo"')]),
    ("[get_weather(city=b'Oslo')]", "[get_weather(city=b'Oslo')]", []),
    ("[get_weather(days=1e999)]", "[get_weather(days=1e999)]", []),
    ("[get_weather(**where)]", "[get_weather(**where)]", []),
    # A keyword given twice is written twice (json.loads keeps the last value).
    ("[get_weather(days=1, city='Oslo', days=2), now()]", None,
     [("get_weather", '{"days": 1, "city": "Oslo", "days": 2}'), ("now", {})]),
    ("[weather.get(city='Oslo')]", "[weather.get(city='Oslo')]", []),
    # A call broken off once known: it stays, the text from where it broke
    # is content.
    ("[now().isoformat()]", ".isoformat()]", [("now", {})]),
    ("[now()(1)]", "(1)]", [("now", {})]),
    ("[now() now()]", "now()]", [("now", {})]),
    ("[say(text='a\nb')]", "\nb')]", [("say", '{"text": "a')]),
    # The run ends at the first element that is not a call.
    ("[now(), get_weather(city=oslo)]", "get_weather(city=oslo)]", [("now", {})]),
    ("[now(), 7]", "7]", [("now", {})]),
    ("[now()]]", "]", [("now", {})]),
    # From the "[" on, a comment is blank space, as Python reads it: between
    # calls, inside an argument list across lines (a quote or bracket in it
    # is no string's or list's), after the list (no content); before the
    # "[" it is content.
    ("[get_weather(city='Oslo', days=2),  # first\n now()]", None,
     [("get_weather", WEATHER), ("now", {})]),
    ("[get_weather(city='Oslo',  # it's [not] (a) 'str\n days=2)  # ]\n, now()]  # done", None,
     [("get_weather", WEATHER), ("now", {})]),
    ("[now(),\n# then\n# and\nnow()]\n# x\nDone.", "Done.", [("now", {}), ("now", {})]),
    ("[now(),  # cut in a comment", None, [("now", {})]),
    ("# calls\n[now()]", "# calls\n[now()]", []),
    # A dict key Python holds equal to an earlier one in its dict is
    # written again under that one's spelling.
    ("[f(a={True: 1, 1: 'x', 1.0: None}, b={0.0: 1, False: 2, '0': 3, None: 4, None: 5})]", None,
     [("f", '{"a": {"true": 1, "true": "x", "true": null}, '
            '"b": {"0.0": 1, "0.0": 2, "0": 3, "null": 4, "null": 5}}')]),
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
    ('[TOOL_CALLS]bash', '[TOOL_CALLS]bash', []),
    # Cut in a call, or its JSON broken off, once its arguments began: the
    # call stays, its arguments as far as they came.
    ('[TOOL_CALLS]bash{"command": "ls"', None, [("bash", '{"command": "ls"')]),
    ('[TOOL_CALLS]bash{"command": "ls",}', "}", [("bash", '{"command": "ls", ')]),
    ('[TOOL_CALLS][{"arguments": {}}]', '[TOOL_CALLS][{"arguments": {}}]', []),
    ('[TOOL_CALLS][{"name": 7, "arguments": {}}]', '[TOOL_CALLS][{"name": 7, "arguments": {}}]',
     []),
    # The run ends at the first piece that is not a call.
    ('[TOOL_CALLS]now{}[TOOL_CALLS]bash{"a": ', None, [("now", {}), ("bash", '{"a": ')]),
    ('[TOOL_CALLS][{"name": "now", "arguments": {"a": [', None, [("now", '{"a": [')]),
    ('[TOOL_CALLS][{"name": "now", "arguments": {}}, {"name": 1}]', '{"name": 1}]',
     [("now", {})]),
    ('[TOOL_CALLS]now{} {"name": "now"}', '{"name": "now"}', [("now", {})]),
]


# The tools qwen3_coder reads its values by (each one's parameters schema).
SCHEMAS = {"get_weather": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}},
    "say": {"type": "object", "properties": {
        "n": {"type": "number"}, "on": {"type": "boolean"}, "tags": {"type": "array"},
        "opt": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}


def _q(name: str, *parameters: tuple[str, str]) -> str:
    """A qwen3_coder block, written as Qwen3-Coder writes one."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# (text, content, [(name, arguments)]) for qwen3_coder
QWEN3_CODER = [
    ("Nothing to call.", "Nothing to call.", []),
    (_q("get_weather", ("city", "Oslo"), ("days", "2")), None, [("get_weather", WEATHER)]),
    ("Checking.\n" + _q("get_weather", ("city", "Oslo"), ("days", "2")) + "\n" + _q("now"),
     "Checking.\n", [("get_weather", WEATHER), ("now", {})]),
    # Values by their schema's type: a string stays as written (line breaks
    # inside kept, one at each end dropped), numbers, booleans, arrays,
    # null for a nullable one; a key no schema knows stays a string.
    (_q("say", ("n", "2.50"), ("on", "True"), ("tags", '["a", 1]'), ("opt", "None"),
        ("note", "two\nlines\n"), ("extra", "7")), None,
     [("say", {"n": 2.5, "on": True, "tags": ["a", 1], "opt": None, "note": "two\nlines\n",
               "extra": "7"})]),
    (_q("say", ("n", "3.0"), ("tags", "['x', None]"), ("on", "yes")), None,
     [("say", {"n": 3, "tags": ["x", None], "on": False})]),
    (_q("get_weather", ("days", "two"), ("city", "null")), None,
     [("get_weather", {"days": "two", "city": "null"})]),
    # </parameter> left out: the next parameter or </function> ends a value.
    ("<tool_call><function=get_weather><parameter=city>Oslo<parameter=days>2</function>"
     "</tool_call> Done.", "Done.", [("get_weather", WEATHER)]),
    # Cut in a call: the call with its parameters so far.
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOs", None,
     [("get_weather", {"city": "Os"})]),
    # Not a call: content from the tag on.
    ("Hm <tool_call>\nhello\n</tool_call>", "Hm <tool_call>\nhello\n</tool_call>", []),
    ("<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>",
     "<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>", []),
    ("<tool_call>\n<function=now", "<tool_call>\n<function=now", []),
    ("x < y <tool", "x < y <tool", []),
    # The run ends at the first block that is no call, or other text.
    (_q("now") + "<tool_call>oops</tool_call>", "<tool_call>oops</tool_call>", [("now", {})]),
    (_q("now") + " and " + _q("now"), "and " + _q("now"), [("now", {})]),
]






def _read(parser: str, pieces: list[str]) -> tuple[dict, list[dict], object]:
    reader = TOOL_CALL_PARSERS[parser](SCHEMAS)
    deltas = [reader.delta(piece, last=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    return reader.message(), deltas, reader


def _whole(parser: str, text: str) -> tuple[dict, list[dict], object]:
    return _read(parser, [text])


def _named(calls: list[dict]) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def _expected(calls: list[tuple[str, dict | str]]) -> list[tuple[str, str]]:
    """Each call's arguments text: json.dumps' text of an object (as
    vLLM's parsers write it), or as given (arguments cut short)."""
    return [(name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
            for name, args in calls]


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
                         + [("mistral", *case) for case in MISTRAL]
                         + [("qwen3_coder", *case) for case in QWEN3_CODER])
def test_each_text_reads_as_its_rule_says_in_pieces_of_every_size(parser, text, content, calls):
    for pieces in splits(text):
        message, deltas, reader = _read(parser, pieces)
        assert message["content"] == content, pieces
        assert _named(message.get("tool_calls", [])) == _expected(calls), pieces
        if not calls:
            assert message == {"content": text}
            assert reader.finish_reason("stop") == "stop"
        else:
            assert reader.finish_reason("stop") == "tool_calls"
            assert reader.finish_reason("length") == "length"
        # The stream: content as it comes; each call's first entry, then
        # its arguments in pieces, adding up to the message's call.
        streamed = "".join(d.get("content", "") for d in deltas)
        assert streamed == (content or "")
        entries = [e for d in deltas for e in d.get("tool_calls", [])]
        assert assembled(entries) == message.get("tool_calls", [])
        ids = [c["id"] for c in message.get("tool_calls", [])]
        assert len(set(ids)) == len(ids) and all(_valid_id(parser, i) for i in ids)


def test_arguments_are_the_json_text_of_the_object_given():
    text = '{"name": "say", "parameters": {"text": "h\\u00e9llo",\n "n": [1, 2.50, 1E2, null]}}'
    message, _, _ = _whole("llama3_json", text)
    [call] = message["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["arguments"] == '{"text": "héllo", "n": [1, 2.5, 100.0, null]}'


def test_pythonic_keyword_given_twice_reads_as_vllm_reads_the_call():
    """vLLM's pythonic parser reads ``[get_weather(days=1, city='Oslo',
    days=2)]`` with ``ast.parse`` (which takes a keyword given twice) into
    the arguments {"days": 2, "city": "Oslo"}: the last value, at the first
    one's place. The message's arguments, and the stream's pieces joined,
    read as that object."""
    text = "[get_weather(days=1, city='Oslo', days=2)]"
    for pieces in splits(text):
        message, deltas, _ = _read("pythonic", pieces)
        [call] = message["tool_calls"]
        assert message["content"] is None and call["function"]["name"] == "get_weather"
        assert list(json.loads(call["function"]["arguments"]).items()) == [("days", 2),
                                                                          ("city", "Oslo")]
        entries = [e for d in deltas for e in d.get("tool_calls", [])]
        assert assembled(entries) == message["tool_calls"]


def _python_calls(text: str) -> list[tuple[str, dict]]:
    """The calls of a pythonic answer as vLLM's parser reads them: the
    list ``ast.parse`` reads, each call's keyword arguments a dict of the
    values ``ast.literal_eval`` reads (a key given twice: its last value)."""
    [statement] = ast.parse(text).body
    return [(call.func.id, {k.arg: ast.literal_eval(k.value) for k in call.keywords})
            for call in statement.value.elts]


@pytest.mark.parametrize("text", [
    "[get_weather(city='Oslo', days=2),  # first\n now()]",
    "[get_weather(city='Oslo',  # where\n days=2)  # then\n, now(),\n# last\n]  # done",
    "[f(a={True: 1, 1: 'x'}), f(b={1: [], 1.0: {0: 1, False: 2}, 'x': None, 'x': 3})]",
    "[f(a={None: 1, 2: 3, None: 4, 2.0: 5, '2': 6}, a={2: 0, True: 1, 1: 2})]",
    # A "#" in a string is no comment; "\r" ends a comment's line, as "\n" does.
    """[f(a="x # y", b='''#''', c='\\'#'), g(b='#')]  # done""",
    "[f(a=1,  # first\rb=[2,  # ]\r3]),  # then\rg()]  # done\r",
])
def test_pythonic_arguments_read_as_json_loads_reads_vllms(text):
    """The calls ``json.loads`` reads from the answer, whole and streamed,
    are those Python reads from it, each call's arguments as ``json.dumps``
    writes them (so: vLLM's): a comment is blank space, and of dict keys
    Python holds equal (``True``, ``1``, ``1.0``) one member stays, the
    first key, written as ``json.dumps`` writes it, with the last value."""
    want = [(name, list(json.loads(json.dumps(arguments)).items()))
            for name, arguments in _python_calls(text)]
    for pieces in splits(text):
        message, deltas, _ = _read("pythonic", pieces)
        assert message["content"] is None, pieces
        got = [(name, list(json.loads(arguments).items()))
               for name, arguments in _named(message["tool_calls"])]
        assert got == want, pieces
        entries = [e for d in deltas for e in d.get("tool_calls", [])]
        assert assembled(entries) == message["tool_calls"]


def test_pythonic_dict_keys_python_holds_equal_read_as_one_member():
    """``{True: 1, 1: 'x'}`` is one key to Python: vLLM's arguments are
    {"a": {"true": "x"}}, worked out by hand."""
    message, _, _ = _whole("pythonic", "[f(a={True: 1, 1: 'x'})]")
    [call] = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"a": {"true": "x"}}


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


def _entry(reader, text: str, last: bool = False) -> list:
    """The (index, id or None, name or None, arguments) of each entry of
    the delta for ``text``."""
    return [(e["index"], e.get("id"), e["function"].get("name"), e["function"]["arguments"])
            for e in reader.delta(text, last).get("tool_calls", [])]


def test_a_call_starts_once_its_name_and_arguments_have_begun():
    """The first entry comes when the name is whole and the arguments'
    value has begun (not before: ``{"name": "now"}`` is no call), then
    each piece of arguments as it settles."""
    for parser, head in [("hermes", '<tool_call>{"name": "get_weather", '),
                         ("llama3_json", '{"name": "get_weather", ')]:
        reader = TOOL_CALL_PARSERS[parser]()
        assert reader.delta(head) == {}
        key = "arguments" if parser == "hermes" else "parameters"
        assert reader.delta(f'"{key}"') == {}
        assert reader.delta(": ") == {}
        [(index, call_id, name, arguments)] = _entry(reader, '{"ci')
        assert (index, name, arguments) == (0, "get_weather", '{"ci')
        assert call_id == reader.message()["tool_calls"][0]["id"]
        assert _entry(reader, 'ty": "Os') == [(0, None, None, 'ty": "Os')]
        assert _entry(reader, 'lo"}') == [(0, None, None, 'lo"}')]
    late = TOOL_CALL_PARSERS["hermes"]()  # the arguments before the name
    assert late.delta('<tool_call>{"arguments": {"a": "b"}, "na') == {}
    assert _entry(late, 'me": "f"') == [(0, late.found[0]["id"], "f", '{"a": "b"}')]
    mistral = TOOL_CALL_PARSERS["mistral"]()
    assert mistral.delta("Sure [TOOL") == {"content": "Sure "}
    assert mistral.delta("_CALLS]now[AR") == {}
    assert _entry(mistral, 'GS]{"a": "}"') == [(0, mistral.found[0]["id"], "now",
                                               '{"a": "}"')]
    assert _entry(mistral, "}") == [(0, None, None, "}")]
    assert mistral.delta("", last=True) == {}


# (parser, text, [(prefix length or the text it ends with, arguments out by then)])
HELD = [
    # A number until the character after it; a literal likewise.
    ("hermes", '<tool_call>{"name": "f", "arguments": {"n": 12, "t": true}}</tool_call>',
     [('{"n": 1', '{"n": '), ('{"n": 12', '{"n": '), ('{"n": 12,', '{"n": 12, '),
      ('"t": tru', '{"n": 12, "t": '), ('"t": true', '{"n": 12, "t": '),
      ('"t": true}', '{"n": 12, "t": true}')]),
    # The call object's brace and the end tag are not arguments: nothing
    # more goes out after the arguments' own brace.
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": "x"}}</tool_call>',
     [('"x"', '{"a": "x"'), ('"x"}', '{"a": "x"}'), ('"x"}}', '{"a": "x"}'),
      ('</tool_', '{"a": "x"}')]),
    # A string's characters at once; an escape when whole; a high
    # surrogate's escape until the next tells whether they pair.
    ("llama3_json", '{"name": "f", "parameters": {"s": "ab\\u00e9\\ud83d\\ude00\\ud83dz"}}',
     [('"ab', '{"s": "ab'), ('"ab\\', '{"s": "ab'), ('"ab\\u00e', '{"s": "ab'),
      ('"ab\\u00e9', '{"s": "abé'), ('\\ud83d', '{"s": "abé'),
      ('\\ud83d\\ude0', '{"s": "abé'), ('\\ude00', '{"s": "abé😀'),
      ('\\ud83dz', '{"s": "abé😀\ud83dz')]),
    # pythonic: a keyword, a comma and a closing quote wait for what follows;
    # Python's escapes and spellings are written as json.dumps writes them.
    ("pythonic", "[f(n=0x1F, s='a\\x41' \"b\", t=[1,],)]",
     [("(n", ""), ("(n=", ""), ("(n=0x1F", ""), ("(n=0x1F,", '{"n": 31'),
      ("s='a", '{"n": 31, "s": "a'), ("\\x4", '{"n": 31, "s": "a'),
      ("\\x41", '{"n": 31, "s": "aA'), ("\\x41'", '{"n": 31, "s": "aA'),
      ("\\x41' \"", '{"n": 31, "s": "aA'), ('"b', '{"n": 31, "s": "aAb'),
      ('"b",', '{"n": 31, "s": "aAb"'), ("[1,", '{"n": 31, "s": "aAb", "t": [1'),
      ("[1,]", '{"n": 31, "s": "aAb", "t": [1]'), ("],)", '{"n": 31, "s": "aAb", "t": [1]}')]),
    # Blank space is dropped, separators written as json.dumps writes them.
    ("mistral", '[TOOL_CALLS]f[ARGS]{ "a" :[ 1 ,2 ] }',
     [('{', '{'), ('{ "a"', '{"a"'), ('{ "a" :', '{"a": '), ('[ 1 ,', '{"a": [1, '),
      ('2 ]', '{"a": [1, 2]'), ('2 ] }', '{"a": [1, 2]}')]),
]


@pytest.mark.parametrize("parser, text, marks", HELD)
def test_a_stream_holds_back_only_what_may_still_change(parser, text, marks):
    """Fed one character at a time, the arguments out after each prefix are
    a prefix of the final ones, and at each hand-worked mark exactly what
    that prefix settles."""
    reader = TOOL_CALL_PARSERS[parser]()
    out = []
    for char in text:
        reader.delta(char)
        out.append(reader.found[0]["function"]["arguments"] if reader.found else "")
    reader.delta("", last=True)
    final = reader.found[0]["function"]["arguments"]
    assert all(final.startswith(arguments) for arguments in out)
    for mark, want in marks:
        assert out[text.index(mark) + len(mark) - 1] == want, mark


def test_pythonic_holds_the_list_and_sends_a_call_once_its_first_value_begins():
    """pythonic holds the answer from its ``[`` on; a call's first entry
    comes once its first value begins (``f(city=oslo)`` is no call) or its
    ``)`` follows the ``(``, then its arguments as they settle; text that
    does not start with a list goes out at once."""
    pythonic = TOOL_CALL_PARSERS["pythonic"]()
    assert pythonic.delta(" ") == {}
    assert pythonic.delta("[now(") == {}
    [(index, call_id, name, arguments)] = _entry(pythonic, ")")
    assert (index, name, arguments) == (0, "now", "{}") and call_id
    assert pythonic.delta(", say(text=") == {}
    [(index, call_id, name, arguments)] = _entry(pythonic, '"])')
    assert (index, name, arguments) == (1, "say", '{"text": "])')
    assert _entry(pythonic, '"') == []  # 'x' 'y' is one string: the quote waits
    assert _entry(pythonic, ")") == [(1, None, None, '"}')]
    assert pythonic.delta("] Done", last=True) == {"content": "Done"}
    plain = TOOL_CALL_PARSERS["pythonic"]()
    assert plain.delta("Hi [") == {"content": "Hi ["}


@pytest.mark.parametrize("parser, text", [
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}'
               '</tool_call>'),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}'),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 2}'),
    ("pythonic", '[get_weather(city="Oslo", days=2)]'),
])
def test_a_long_call_streams_its_arguments_in_manypieces_of(parser, text):
    reader = TOOL_CALL_PARSERS[parser]()
    entries = [e for char in text for e in reader.delta(char).get("tool_calls", [])]
    pieces = argument_pieces(entries, 0)
    assert len(pieces) > 5 and "".join(pieces) == json.dumps(WEATHER)


# (value, its property's schema, what it reads as) by vLLM's qwen3_coder rules
CONVERTED = [
    ("Oslo", None, "Oslo"), ("12", {"type": "string"}, "12"), ("null", {"type": "string"}, "null"),
    ("None", {"anyOf": [{"type": "string"}, {"type": "null"}]}, None),
    ("NULL", {"type": "integer"}, None), ("12", {"type": "integer"}, 12),
    ("1_000", {"type": "int64"}, 1000), ("1.5", {"type": "integer"}, "1.5"),
    ("2.0", {"type": "number"}, 2), ("-0.25", {"type": "float"}, -0.25),
    ("inf", {"type": "number"}, "inf"), ("nan", {"type": "number"}, "nan"),
    ("TRUE", {"type": "boolean"}, True), ("1", {"type": "boolean"}, False),
    ('{"a": [1, 2]}', {"type": "object"}, {"a": [1, 2]}), ("{'a': (1, 2)}", {"type": "object"},
                                                           {"a": [1, 2]}),
    ('"[1, 2]"', {"type": "array"}, [1, 2]), ("[1, 2", {"type": "array"}, "[1, 2"),
    ("{1, 2}", {"type": "array"}, "{1, 2}"), ("3", {"type": "widget"}, 3),
    ("x", {"description": "no type"}, "x"), ("7", {"anyOf": [{"type": "integer"}]}, 7),
]


def test_qwen3_coder_streams_each_parameter_once_its_value_ends():
    """As vLLM streams it: the first entry and ``{`` once the name is
    whole, each ``"key": value`` when its value ends, ``}`` with the
    ``</function>``."""
    text = _q("get_weather", ("city", "Oslo"), ("days", "2"))
    reader = TOOL_CALL_PARSERS["qwen3_coder"](SCHEMAS)
    out = []
    for char in text:
        entries = reader.delta(char).get("tool_calls", [])
        out += [(e.get("function", {}).get("name"), e["function"]["arguments"]) for e in entries]
    assert out == [("get_weather", "{"), (None, '"city": "Oslo"'), (None, ', "days": 2'),
                   (None, "}")]
    cut = TOOL_CALL_PARSERS["qwen3_coder"](SCHEMAS)
    cut.delta(text[:text.index("Oslo") + 2])
    assert [c["function"]["arguments"] for c in cut.found] == ["{"]
    cut.delta("", last=True)
    assert [c["function"]["arguments"] for c in cut.found] == ['{"city": "Os"}']


@pytest.mark.parametrize("value, schema, want", CONVERTED)
def test_qwen3_coder_reads_each_value_by_its_schemas_type(value, schema, want):
    from serving.http.qwen3_coder import converted

    got = json.loads(json.dumps(converted(value, schema)))  # as the arguments carry it
    assert got == want and type(got) is type(want)


def test_qwen3_coder_keeps_a_value_nested_past_the_json_parsers_depth_as_text():
    """An array too deep for ``json.loads`` (or one cut short) stays the
    model's text, as vLLM keeps it, rather than failing the answer."""
    from serving.http.qwen3_coder import converted

    deep = "[" * 100_000
    assert converted(deep, {"type": "array"}) == deep
