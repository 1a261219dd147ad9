"""The tool-call readers' work grows in proportion to the answer, however
small the pieces it streams in. For each reader, a long run of one kind of
text (blank space, a name, a value, text inside a block) is fed one to
three characters at a time and the characters its searches go over are
counted (``SearchCount``: the readers' regular expressions and the finds
on their text; no clock is read). Doubling the run must about double that
count, where searches that start over at each piece would quadruple it.
The reading itself must be the one-shot reading's: the same content and
calls, with the stream's pieces adding up to them.

Nor is text copied whole for each piece: a long call (and a long answer of
content; a named and a "required" tool choice's calls too) fed four
characters at a time, the memory each piece allocates
at its peak (``tracemalloc``, which counts allocations, not time) summed
over the pieces must about double when the call does, where copying the
answer, its content, a call's arguments or the blank text before a named
call so far at each piece would quadruple it. And, counted on the readers'
text itself (what its searches go over and what it copies), each piece
costs a bound that the text before it does not raise, but for the one
piece that settles a long token, whatever the interpreter does with
strings."""

from __future__ import annotations

import itertools
import json
import tracemalloc

import pytest

from serving.http import auto_calls, canonical_json, python_arguments, qwen3_coder, tool_parsers
from serving.http import tools as tools_module
from serving.http.streamed_text import StreamedText
from serving.http.tool_parsers import TOOL_CALL_PARSERS
from serving.http.tools import NamedCallReader, RequiredCallsReader
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
    _run("a comment after a call", "pythonic", "[f() #", "x", "\n]"),
    _run("comments between calls", "pythonic", "[f(),", " #\n", "f()]"),
    _run("a comment after the list", "pythonic", "[f()] #", "x", "\nDone."),
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


def _read(parser: str, pieces: list[str], text: StreamedText | None = None) -> tuple:
    """The message (ids left out), and the stream's content and calls put
    together (ids left out), of ``pieces`` read into ``text`` (a fresh
    ``StreamedText`` if None)."""
    reader = NamedCallReader("f") if parser == "named" else TOOL_CALL_PARSERS[parser](SCHEMAS)
    if text is not None and parser != "named":
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


def _members(n: int) -> dict:
    return {f"k{i}": [i, "vvvv", {"x": True}] for i in range(n)}


# A call (or content) that grows with n: a JSON object of n members, n
# keyword arguments, n parameters.
LONG = {
    "llama3_json": lambda n: '{"name": "f", "parameters": ' + json.dumps(_members(n)) + "}",
    "hermes": lambda n: ('<tool_call>{"name": "f", "arguments": ' + json.dumps(_members(n))
                         + "}</tool_call>"),
    "mistral": lambda n: "[TOOL_CALLS]f" + json.dumps(_members(n)),
    "pythonic": lambda n: "[f(" + ", ".join(f"k{i}=[{i}, 'vvvv', {{'x': True}}]"
                                            for i in range(n)) + ")]",
    "qwen3_coder": lambda n: ("<tool_call>\n<function=f>\n"
                              + "".join(f"<parameter=k{i}>\n{i}\n</parameter>\n"
                                        for i in range(n)) + "</function>\n</tool_call>"),
    "named": lambda n: json.dumps(_members(n)),
    "named after blank space": lambda n: " \n" * (30 * n) + '{"a": "x"}',
    "required": lambda n: '[{"name": "f", "parameters": ' + json.dumps(_members(n)) + "}]",
    "content": lambda n: "Some words of content. " * n,
}


def _allocated(parser: str, text: str) -> int:
    """The memory each piece of ``text`` (four characters each) allocates
    beyond what was held before it, at its peak, summed over the pieces."""
    if parser in ("named", "named after blank space", "required"):
        reader = RequiredCallsReader() if parser == "required" else NamedCallReader("f")
    else:
        reader = TOOL_CALL_PARSERS["hermes" if parser == "content" else parser](SCHEMAS)
    pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
    total = 0
    tracemalloc.start()
    try:
        for i, piece in enumerate(pieces):
            tracemalloc.reset_peak()
            held = tracemalloc.get_traced_memory()[0]
            reader.delta(piece, last=i == len(pieces) - 1)
            total += tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    message = reader.message()
    if parser == "content":
        assert message == {"content": text}
    else:
        assert json.loads(message["tool_calls"][0]["function"]["arguments"])
    return total


@pytest.mark.parametrize("parser", sorted(LONG))
def test_no_piece_copies_the_answer_so_far(parser):
    allocated = [_allocated(parser, LONG[parser](n)) for n in (300, 600)]
    assert allocated[1] <= 2.5 * allocated[0], allocated


def _work_per_piece(parser: str, text: str, count: SearchCount) -> list[int]:
    """What each piece of ``text`` (1 to 3 characters) costs the reader's
    text: the characters its searches go over and those it copies."""
    reader = RequiredCallsReader() if parser == "required" else TOOL_CALL_PARSERS[parser](SCHEMAS)
    reader.text = count.text()
    pieces, work = _cut(text), []
    for i, piece in enumerate(pieces):
        before = count.chars + count.copied
        reader.delta(piece, last=i == len(pieces) - 1)
        work.append(count.chars + count.copied - before)
    return work


# What a piece of 1 to 3 characters may cost: the window (the piece and up
# to 64 characters before it) and the searches from the cursors in it.
PIECE_BOUND = 200
PIECE_CASES = [param for param in RUNS if param.values[0] != "named"] + [
    _run(f"a long call ({parser})", parser, "", LONG[parser](300), "")
    for parser in ("llama3_json", "hermes", "mistral", "pythonic", "qwen3_coder", "required")
] + [_run("long content", "hermes", "", LONG["content"](300), "")]


@pytest.mark.parametrize("parser, before, run, after", PIECE_CASES)
def test_each_piece_costs_a_bound_that_the_text_before_it_does_not_raise(monkeypatch, parser,
                                                                         before, run, after):
    """Counted on the text itself (``CountedText``), not on how an
    interpreter grows strings: every piece costs at most ``PIECE_BOUND``,
    whatever came before it, but for one piece that settles a
    long token or run (a value, a name, the content held since a call
    might start), which copies it once."""
    count = SearchCount(monkeypatch, MODULES)
    text = before + run * (2000 if len(run) < 8 else 1) + after
    work = _work_per_piece(parser, text, count)
    over = [w for w in work if w > PIECE_BOUND]
    assert len(over) <= 1 and sum(over) <= 8 * len(text), (len(work), sorted(work)[-5:])
