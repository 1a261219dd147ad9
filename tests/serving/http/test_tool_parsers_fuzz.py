"""Each tool-call parser reads an answer streamed in pieces cut anywhere as
it reads the whole answer at once: the same content and calls, with the
stream's deltas adding up to them. The answers are random runs of calls
in each parser's syntax (names, JSON or Python values of every kind,
blank space), cut short or with stray text put in, so that the cuts fall
inside tags, escapes, names and values, and the readers' states and their
held-back text meet every kind of cut."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from serving.http.tool_parsers import TOOL_CALL_PARSERS
from tests.helpers.tool_stream import assembled

SCHEMAS = {"f": {"type": "object", "properties": {"a": {"type": "integer"},
                                                  "b": {"type": "string"}}}}
NAMES = st.sampled_from(["f", "get_weather", "a"])
KEYS = st.sampled_from(["a", "b", "city", "é"])
BLANK = st.sampled_from(["", " ", "\n", "  \n"])
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000)
    | st.floats(allow_nan=False, allow_infinity=False, width=32) | st.text("ab\"\\é😀\n", max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=5)
ARGUMENTS = st.dictionaries(KEYS, VALUES, max_size=3)
# Stray text: what a model may write by mistake, and the syntaxes' own tokens.
STRAY = st.sampled_from([" ", "x", "é", "😀", "{", "}", "[", "]", ",", '"', "\\", ";", "(", ")",
                         "<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]",
                         "[ARGS]", "<function=f>", "</function>", "<parameter=a>",
                         "</parameter>", "'", "="])


@st.composite
def _json(draw, value) -> str:
    """``value`` as JSON text: ASCII escapes or not, compact or indented."""
    return json.dumps(value, ensure_ascii=draw(st.booleans()),
                      indent=draw(st.sampled_from([None, 1])))


@st.composite
def _call_object(draw, keys: tuple[str, ...]) -> str:
    members = [f'"name": {json.dumps(draw(NAMES))}',
               f'"{draw(st.sampled_from(keys))}": {draw(_json(draw(ARGUMENTS)))}']
    if draw(st.booleans()):
        members.reverse()
    return "{" + draw(BLANK) + ", ".join(members) + "}"


@st.composite
def _llama3_json(draw) -> str:
    calls = draw(st.lists(_call_object(("parameters", "arguments")), min_size=1, max_size=3))
    tag = draw(st.sampled_from(["", "<|python_tag|>"]))
    return draw(BLANK) + tag + draw(st.sampled_from([";", " ; ", ";\n"])).join(calls)


@st.composite
def _hermes(draw) -> str:
    calls = draw(st.lists(_call_object(("arguments",)), min_size=1, max_size=3))
    return (draw(st.text("ab ", max_size=3))
            + "".join(f"<tool_call>{draw(BLANK)}{c}{draw(BLANK)}</tool_call>{draw(BLANK)}"
                      for c in calls))


@st.composite
def _pythonic(draw) -> str:
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        arguments = draw(ARGUMENTS)
        keywords = ", ".join(f"{key}={value!r}" for key, value in arguments.items()
                             if key.isidentifier())
        calls.append(f"{draw(NAMES)}({keywords})")
    return draw(BLANK) + "[" + ", ".join(calls) + draw(st.sampled_from(["", ","])) + "]"


@st.composite
def _mistral(draw) -> str:
    segments = []
    for _ in range(draw(st.integers(1, 2))):
        if draw(st.booleans()):
            objects = draw(st.lists(_call_object(("arguments",)), min_size=1, max_size=2))
            segments.append("[TOOL_CALLS][" + ", ".join(objects) + "]")
        else:
            args = draw(st.sampled_from(["", "[ARGS]", " [ARGS] "]))
            segments.append(f"[TOOL_CALLS]{draw(NAMES)}{args}{draw(_json(draw(ARGUMENTS)))}")
    return draw(st.text("ab ", max_size=3)) + draw(BLANK).join(segments)


@st.composite
def _qwen3_coder(draw) -> str:
    blocks = []
    for _ in range(draw(st.integers(1, 2))):
        parameters = "".join(
            f"<parameter={key}>\n{draw(st.sampled_from(['12', 'null', 'x y', '[1, 2]', '']))}"
            f"\n</parameter>\n" for key in draw(st.lists(KEYS, max_size=3)))
        blocks.append(f"<tool_call>\n<function={draw(NAMES)}>\n{parameters}</function>\n"
                      "</tool_call>")
    return draw(st.text("ab ", max_size=3)) + draw(BLANK).join(blocks)


ANSWERS = {"llama3_json": _llama3_json, "hermes": _hermes, "pythonic": _pythonic,
           "mistral": _mistral, "qwen3_coder": _qwen3_coder}


def _read(parser: str, pieces: list[str]) -> tuple:
    """The message's content and calls (ids left out), and the stream's
    content and calls put together (ids left out)."""
    reader = TOOL_CALL_PARSERS[parser](SCHEMAS)
    deltas = [reader.delta(piece, last=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    message = reader.message()
    calls = [{**call, "id": None} for call in message.get("tool_calls", [])]
    entries = [e for d in deltas for e in d.get("tool_calls", [])]
    streamed = [{**call, "id": None} for call in assembled(entries)]
    return message["content"], calls, "".join(d.get("content", "") for d in deltas), streamed


@st.composite
def _answers(draw) -> tuple[str, str, list[int]]:
    """A parser, an answer in its syntax (cut short, or with stray text
    put in, or neither), and where the stream cuts it."""
    parser = draw(st.sampled_from(sorted(ANSWERS)))
    text = draw(ANSWERS[parser]())
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(STRAY) + text[at:]
    if draw(st.booleans()):
        text = text[:draw(st.integers(0, len(text)))]  # max_tokens ended it
    text += draw(st.sampled_from(["", " Done.", "\n"]))
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=10))
    return parser, text, sorted(set(cuts))


@settings(max_examples=1500, deadline=None)
@given(answer=_answers())
def test_a_stream_cut_anywhere_reads_as_the_whole_answer(answer):
    parser, text, cuts = answer
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    content, calls, streamed_content, streamed_calls = _read(parser, pieces)
    assert (content, calls) == _read(parser, [text])[:2]
    assert streamed_content == (content or "")
    assert streamed_calls == calls
