"""Each reader, fed a realistic answer cut at random places, streams what
it reads from the whole answer in one piece: the same content and calls,
the stream's deltas adding up to them. Run as served (a window of the
newest piece and ``LOOKBACK`` characters) and with no lookback at all,
where every look at earlier text goes to the pieces kept since the
reader's ``_needed_from``, so that letting go of text a reader still
reads fails (``LookupError``) instead of passing unseen."""

from __future__ import annotations

import random

import pytest

from serving.http.streamed_text import StreamedText
from serving.http.tool_parsers import TOOL_CALL_PARSERS
from serving.http.tools import RequiredCallsReader
from tests.helpers.tool_stream import assembled

SCHEMAS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"},
                                                            "days": {"type": "integer"}}}}
ANSWERS = {
    "hermes": [
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris",'
        ' "days": 3}}\n</tool_call>\n<tool_call>\n{"arguments": {"city": "Z\\u00fcrich \\ud83d'
        '\\ude00"}, "name": "get_weather"}\n</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "x": [1.5e3, null,'
        ' true, {"k": "v"}]}}</tool_call> trailing words',
        'Text <tool_call>{"name": 3, "arguments": {}}</tool_call> then more',
        '<tool_call>{"name": "get_weather", "arguments": {"city": "cut off he',
    ],
    "llama3_json": [
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_weather", "parameters": {"city": "Rome", "days": 10}}',
        '  {"name": "get_weather", "arguments": {"list": [1, 2, -3.25e-2], "s": "a\\"b"}} and text',
        'I cannot call a tool {"name": "get_weather"}',
        '{"name": "get_weather", "parameters": {"city": "Nic',
    ],
    "pythonic": [
        '[get_weather(city="Paris", days=3), get_weather(city=\'Rome\',  # second\n days=0x1F)]',
        '[get_weather(city="""multi\nline""", data={"a": [1, 2.5, None], 1: True}, n=-1_000,)]',
        "[get_weather(city='\\N{LATIN SMALL LETTER E WITH ACUTE}t\\u00e9' 'joined')] # done",
        "Sure: [get_weather(city='Paris')]",
        "[get_weather(city='Paris'), 42]",
        "[get_weather(city='Par",
    ],
    "mistral": [
        'Calling. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}},'
        ' {"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}]',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_weather{"days": 4}',
        '[TOOL_CALLS] get_weather [ARGS] {"city": "Paris", "nested": {"a": [true, false]}} tail',
        '[TOOL_CALLS]not a call at all',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Ber',
    ],
    "qwen3_coder": [
        'Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
        '<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n'
        '<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n</function>\n'
        '</tool_call>',
        '<tool_call><function=get_weather><parameter=city>Oslo<parameter=days>12</function>'
        '</tool_call> then text',
        '<tool_call>\n<function=bad name>\n</function>\n</tool_call>',
        '<tool_call>\n<function=get_weather>\n<parameter=city>\nLon',
    ],
    "required": [
        '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, '
        '{"name": "get_weather", "parameters": {"city": "Z\\u00fcrich"}}]',
        '[ {"name": "get_weather", "parameters": {"a": [1, {"b": null}], "c": 1e2}} ]',
        '[{"name": "get_weather", "parameters": {"city": "cut',
    ],
}
CASES = [pytest.param(parser, text, id=f"{parser} {i}")
         for parser, texts in ANSWERS.items() for i, text in enumerate(texts)]


def _reader(parser: str):
    return RequiredCallsReader() if parser == "required" else TOOL_CALL_PARSERS[parser](SCHEMAS)


def _read(parser: str, pieces: list[str]) -> tuple:
    """The message (ids left out), and the stream's content and calls put
    together (ids left out)."""
    reader = _reader(parser)
    deltas = [reader.delta(piece, last=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    message = reader.message()
    calls = [{**call, "id": None} for call in message.get("tool_calls", [])]
    streamed = [{**call, "id": None}
                for call in assembled([e for d in deltas for e in d.get("tool_calls", [])])]
    content = "".join(d.get("content") or "" for d in deltas)
    return message["content"], calls, content, streamed


def _random_cuts(text: str, rng: random.Random) -> list[str]:
    """``text`` cut at a random number of random places."""
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(len(text) - 1, 40))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize("lookback", [StreamedText.LOOKBACK, 0])
@pytest.mark.parametrize("parser, text", CASES)
def test_a_stream_cut_anywhere_reads_as_the_whole_answer(monkeypatch, parser, text, lookback):
    content, calls = _read(parser, [text])[:2]
    if parser != "required":
        assert (content or "") + "".join(c["function"]["arguments"] for c in calls) != ""
    monkeypatch.setattr(StreamedText, "LOOKBACK", lookback)
    rng = random.Random(f"{parser} {text}")
    splits = [_random_cuts(text, rng) for _ in range(150)]
    splits += [list(text), [text[:len(text) // 2], text[len(text) // 2:]]]
    for pieces in splits:
        got = _read(parser, pieces)
        assert got[:2] == (content, calls), pieces
        assert got[2] == (content or "") and got[3] == calls, pieces


def test_the_whole_answers_read_as_worked_out_by_hand():
    """The reference itself, for a few of the answers."""
    content, calls = _read("hermes", [ANSWERS["hermes"][0]])[:2]
    assert content == "Let me check.\n"
    assert [c["function"]["arguments"] for c in calls] == [
        '{"city": "Paris", "days": 3}', '{"city": "Zürich 😀"}']
    content, calls = _read("pythonic", [ANSWERS["pythonic"][0]])[:2]
    assert content is None
    assert [c["function"]["arguments"] for c in calls] == [
        '{"city": "Paris", "days": 3}', '{"city": "Rome", "days": 31}']
    content, calls = _read("mistral", [ANSWERS["mistral"][3]])[:2]
    assert (content, calls) == ("[TOOL_CALLS]not a call at all", [])
    content, calls = _read("qwen3_coder", [ANSWERS["qwen3_coder"][1]])[:2]
    assert content == "then text"  # blank space between the run and content is the run's
    assert calls[0]["function"]["arguments"] == '{"city": "Oslo", "days": 12}'
