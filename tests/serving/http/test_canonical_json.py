"""``CanonicalJson`` against the ``json`` module: for JSON texts written
every which way (blank space, escapes, number spellings), fed whole, in
pieces of every size and split in two at every character, what it writes
is ``json.dumps(json.loads(text), ensure_ascii=False)``, and where the text
stops being JSON it says where, having written only the canonical text of
what came before."""

from __future__ import annotations

import json
import random

import pytest

from serving.http.canonical_json import CanonicalJson
from tests.helpers.tool_stream import scanned, splits

TEXTS = [
    '{"a": 1}',
    ' {"city":"Oslo" ,\n"days":2}\t',
    "[1,2.50,-0,-0.0,1e2,1E+2,0.1e-7,true,false,null,NaN,-Infinity,Infinity,1e999]",
    '"h\\u00e9llo \\ud83d\\ude00 \\ud83d x \\ud83d\\u0041 \\udc00 \\n\\t\\/\\b\\f\\r \\"q\\" é😀"',
    '"\\ud800"', '"\\ud800\\\\"', '"\\ud83d\\n"', '"\\u0000\\u001f\\u007f\\u2028"',
    "{}", "[]", "[[], {}, [{}]]", '{"a":{"b":[{}, [], {"c": "}"}]}}',
    "123", '"x"', "true", "-Infinity", "0",
    '{"n": 12345678901234567890, "f": 0.1000, "g": 1.0e-7, "h": 5E-324}',
    '{"k\\u0022": "v", "": ""}',
]






def _random_string(rng: random.Random) -> str:
    return "".join(rng.choice('ab "\\/\n\t\x01é😀\u2028{}[],:') for _ in range(rng.randint(0, 6)))


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["int", "float", "str", "lit", "list", "dict"] if depth < 3
                      else ["int", "float", "str", "lit"])
    if kind == "int":
        return rng.randint(-10**12, 10**12)
    if kind == "float":
        return rng.choice([rng.uniform(-1e6, 1e6), rng.random() * 1e-9, 1e300, -0.0, 2.5])
    if kind == "str":
        return _random_string(rng)
    if kind == "lit":
        return rng.choice([True, False, None])
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}" + _random_string(rng): _random_value(rng, depth + 1)
            for i in range(rng.randint(0, 3))}


def _spelled(rng: random.Random, value) -> str:
    """``value``'s JSON text with random blank space and escapes."""
    text = json.dumps(value, ensure_ascii=rng.random() < 0.5,
                      separators=rng.choice([(",", ":"), (", ", ": "), (" ,\n", " :\t")]),
                      indent=rng.choice([None, None, 2]))
    return rng.choice(["", " ", "\n "]) + text


@pytest.mark.parametrize("text", TEXTS)
def test_each_text_is_written_as_json_dumps_writes_its_value(text):
    want = json.dumps(json.loads(text), ensure_ascii=False)
    for pieces in splits(text):
        reader = scanned(CanonicalJson(0), pieces)
        assert (reader.out, reader.end, reader.error) == (want, len(text.rstrip()), None), pieces


def test_random_values_spelled_every_which_way():
    rng = random.Random(7)
    for _ in range(300):
        value = _random_value(rng)
        text = _spelled(rng, value)
        want = json.dumps(json.loads(text), ensure_ascii=False)
        for pieces in ([text], list(text), [text[:len(text) // 2], text[len(text) // 2:]]):
            assert scanned(CanonicalJson(0), pieces).out == want, text


# (text, the index where it stops being JSON, what was written before it)
BROKEN = [
    ('{"a": tru}', 6, '{"a": '),
    ('{"a" 1}', 5, '{"a"'),
    ("[1,]", 3, "[1, "),
    ('{"a":1,}', 7, '{"a": 1, '),
    ('"a\nb"', 2, '"a'),
    ("01", 0, ""),
    ('"\\x"', 1, '"'),
    ('"\\u12g4"', 1, '"'),
    ("[1 2]", 3, "[1"),
    ('{"a": 1]', 7, '{"a": 1'),
    ("'a'", 0, ""),
]


@pytest.mark.parametrize("text, at, written", BROKEN)
def test_text_that_is_not_json_stops_where_it_breaks(text, at, written):
    with pytest.raises(ValueError):
        json.loads(text)
    for pieces in splits(text):
        reader = scanned(CanonicalJson(0), pieces)
        assert (reader.error, reader.end, reader.out) == (at, None, written), pieces


def test_a_value_cut_short_is_neither_ended_nor_broken():
    reader = scanned(CanonicalJson(0), ['{"a": [1, "x'])
    assert (reader.out, reader.end, reader.error) == ('{"a": [1, "x', None, None)
