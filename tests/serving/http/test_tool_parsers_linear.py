"""The tool-call readers' work grows in proportion to the answer, however
small the pieces it streams in. For each reader, a long run of one kind of
text (blank space, a name, a value, text inside a block) is fed one to
three characters at a time and the characters its searches go over are
counted (``SearchCount``: the readers' regular expressions and the finds
on their text; no clock is read). Doubling the run must about double that
count, where searches that start over at each piece would quadruple it.
The reading itself must be the one-shot reading's: the same content and
calls, with the stream's pieces adding up to them."""

from __future__ import annotations

import itertools

import pytest

from serving.http import auto_calls, canonical_json, python_arguments, qwen3_coder, tool_parsers
from serving.http import tools as tools_module
from serving.http.tool_parsers import TOOL_CALL_PARSERS
from serving.http.tools import NamedCallReader
from tests.helpers.tool_stream import SearchCount, assembled

MODULES = (auto_calls, tool_parsers, qwen3_coder, python_arguments, canonical_json, tools_module)
SCHEMAS = {"f": {"type": "object", "properties": {"a": {"type": "string"}}}}
LLAMA = '{"name": "f", "parameters": {}}'
HERMES = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
QWEN3 = "<tool_call>\n<function=f>\n</function>\n</tool_call>"


def _run(name: str, parser: str, before: str, run: str, after: str):
    """A long run of ``run`` between ``before`` and ``after``: what
    ``parser`` waits at, named ``name``."""
    return pytest.param(parser, before, run, after, id=f"{parser}: {name}")


VALUE = "<tool_call>\n<function=f>\n<parameter=a>\n"
RUNS = [
    _run("a value", "qwen3_coder", VALUE, "x", "\n</parameter>\n</function>\n</tool_call>"),
    _run("a value the answer is cut in", "qwen3_coder", VALUE, "x", ""),
    _run("a function's name", "qwen3_coder", "<tool_call>\n<function=", "f",
         ">\n</function>\n</tool_call>"),
    _run("a parameter's key", "qwen3_coder", "<tool_call><function=f><parameter=", "k",
         ">1</parameter></function>"),
    _run("text before a parameter", "qwen3_coder", "<tool_call><function=f>", "x",
         "<parameter=a>1</parameter></function>"),
    _run("blank space before the function", "qwen3_coder", "<tool_call>", " ",
         "<function=f></function></tool_call>"),
    _run("blank space after the function", "qwen3_coder", "<tool_call><function=f></function>",
         " ", "</tool_call>"),
    _run("blank space between blocks", "qwen3_coder", QWEN3, " ", QWEN3),
    _run("blank space before the call", "llama3_json", "", " ", LLAMA),
    _run("blank space after the tag", "llama3_json", "<|python_tag|>", " ", LLAMA),
    _run("blank space before a ';'", "llama3_json", LLAMA, " ", ";" + LLAMA),
    _run("blank space after a ';'", "llama3_json", LLAMA + ";", " ", LLAMA),
    _run("text after the call object", "hermes", HERMES[:-len("</tool_call>")], "x",
         "</tool_call>"),
    _run("blank space between blocks", "hermes", HERMES, " ", HERMES),
    _run("blank space before the list", "pythonic", "", " ", "[f()]"),
    _run("blank space after its '['", "pythonic", "[", " ", "f()]"),
    _run("a call's name", "pythonic", "[", "f", "()]"),
    _run("blank space before a '('", "pythonic", "[f", " ", "()]"),
    _run("blank space after a call", "pythonic", "[f()", " ", "]"),
    _run("blank space after the list", "pythonic", "[f()]", " ", ""),
    _run("an escape's character name", "pythonic", "[f(a='\\N{", "x", "}')]"),
    _run("a call's name", "mistral", "[TOOL_CALLS]", "f", "{}"),
    _run("blank space after the token", "mistral", "[TOOL_CALLS]", " ", "f{}"),
    _run("blank space after the name", "mistral", "[TOOL_CALLS]f", " ", "[ARGS]{}"),
    _run("blank space after [ARGS]", "mistral", "[TOOL_CALLS]f[ARGS]", " ", "{}"),
    _run("blank space before an element", "mistral", "[TOOL_CALLS][", " ", '{"name": "f"}]'),
    _run("blank space after an element", "mistral", '[TOOL_CALLS][{"name": "f"}', " ", "]"),
    _run("blank space between segments", "mistral", "[TOOL_CALLS]f{}", " ", "[TOOL_CALLS]f{}"),
    _run("blank space before the arguments", "named", "", " ", "{}"),
]


def _cut(text: str) -> list[str]:
    """``text`` in pieces of 1, 2, 3, 1, 2, 3, ... characters."""
    pieces, at = [], 0
    for size in itertools.cycle((1, 2, 3)):
        if at >= len(text):
            return pieces
        pieces.append(text[at:at + size])
        at += size


def _read(parser: str, pieces: list[str], text: str = "") -> tuple:
    """The message (ids left out), and the stream's content and calls put
    together (ids left out), of ``pieces`` read from ``text`` on."""
    reader = NamedCallReader("f") if parser == "named" else TOOL_CALL_PARSERS[parser](SCHEMAS)
    reader.text = text
    deltas = [reader.delta(piece, last=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    message = reader.message()
    calls = [{**call, "id": None} for call in message.get("tool_calls", [])]
    streamed = [{**call, "id": None}
                for call in assembled([e for d in deltas for e in d.get("tool_calls", [])])]
    content = "".join(d.get("content", "") for d in deltas)
    return message["content"], calls, content, streamed


@pytest.mark.parametrize("parser, before, run, after", RUNS)
def test_a_long_run_is_searched_once_however_small_its_pieces(monkeypatch, parser, before, run,
                                                              after):
    count = SearchCount(monkeypatch, MODULES)
    searched = []
    for length in (2000, 4000):
        text = before + run * length + after
        count.chars = 0
        content, calls, streamed_content, streamed_calls = _read(parser, _cut(text), count.text())
        searched.append(count.chars)
        assert (content, calls) == _read(parser, [text])[:2]
        assert streamed_content == (content or "") and streamed_calls == calls
    assert searched[1] <= 2.5 * searched[0], searched
