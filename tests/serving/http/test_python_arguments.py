"""``PythonArguments`` against Python's own parser: for call texts written
every which way (quotes, escapes, joined strings, number spellings,
comments, trailing commas), fed whole, in pieces of every size and split
in two at every character, what it writes is ``json.dumps`` of the
keyword arguments ``ast`` reads (each value a literal,
``ast.literal_eval``; a keyword given twice written twice); a text Python
reads as no such call stops with an error, having written only the
canonical text of what came before."""

from __future__ import annotations

import ast
import json
import warnings

import pytest

from serving.http.python_arguments import PythonArguments
from serving.http.streamed_text import StreamedText
from tests.helpers.tool_stream import scanned, splits


def reference(text: str) -> str | None:
    """The JSON text of the call's keyword arguments, as Python reads
    ``text`` (``name(...)``): each keyword and its value as ``json.dumps``
    writes an object's members, in the order given (so ``json.dumps`` of
    the arguments' dict, but for a keyword given twice, written twice), or
    None where it is no call of literals."""
    try:
        with warnings.catch_warnings():  # "\\d" and "\\q" are no escapes
            warnings.simplefilter("ignore")
            call = ast.parse(text, mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            return None
        members = []
        for keyword in call.keywords:
            if keyword.arg is None or not _literal(keyword.value):
                return None
            value = ast.literal_eval(keyword.value)
            members.append(json.dumps(keyword.arg, ensure_ascii=False) + ": "
                           + json.dumps(value, ensure_ascii=False, allow_nan=False))
        return "{" + ", ".join(members) + "}"
    except (SyntaxError, ValueError, TypeError):
        return None


def _literal(node: ast.expr) -> bool:
    """Strings, numbers (signed: one sign), True, False, None, lists and
    dicts of them, a dict's keys constants."""
    if isinstance(node, ast.Constant):
        return type(node.value) in (str, int, float, bool, type(None))
    if isinstance(node, ast.UnaryOp):
        return (isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant)
                and type(node.operand.value) in (int, float))
    if isinstance(node, ast.List):
        return all(_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(isinstance(k, ast.Constant) and _literal(k) for k in node.keys) and all(
            _literal(v) for v in node.values)
    return False


CALLS = [
    "f()", "f(a=1)", "f(a=1,)", "f( a = -1.50 , b=+3, c=0x1F, d=1_000, e=1e3, g=.5, h=1E-2, i=0o17)",
    "f(q=['a', {'k': [1, -2.5, +3]}], opts={\"n\": None, 'on': True, 1: False, 2.5: 'x', None: 1})",
    "f(text='It\\'s \"(]\" ok', more=\"a\\nb)]\", long='''x)]\n''')",
    "f(  # all of it)]\n)", "f(a=\"\", b='', c=\"\"\"q\"\"\", d='''''')", 'f(u="é😀")',
    "f(a='x' 'y' r'\\d' \"z\" u'w', b=u'\\u00e9\\x41\\101\\7\\N{BULLET}\\q\\\n.')",
    "f(a=r'\\'', b=[1,2,], c={'a':1,}, d=R\"\\\\\")", "f(a='''multi\nline''', b=\"\"\"'\"'\"\"\")",
    "f(a = True, b=False, c=None, d=[[],{}], e=[[1], {'x': [True]}])",
    "f(big=123456789012345678901234567890, tiny=5e-324, neg=-0.0, zero=-0)",
    "f(a=1, b=[2], a='x', a=None)",
]
NOT_CALLS = [
    ('f("Oslo")', 2), ("f(city=oslo)", 7), ("f(city=('Oslo', 'Bergen'))", 7),
    ("f(city={'Oslo'})", 14), ("f(city=b'Oslo')", 7), ("f(days=1e999)", 7), ("f(**where)", 2),
    ("f(text='a\nb')", 9), ("f(x==1)", 2), ("f(x=1j)", 4),
    ('f(x=f"a")', 4), ("f(x=--1)", 5), ("f(x={-1: 2})", 5), ("f(x=[1 2])", 7),
    ("f(x='a' b)", 8), ("f(x=1 if y else 2)", 6), ("f(x={[1]: 2})", 5), ("f(x='\\xZZ')", 5),
]






@pytest.mark.parametrize("text", CALLS)
def test_each_call_is_written_as_json_dumps_writes_its_keyword_arguments(text):
    want = reference(text)
    assert want is not None
    for pieces in splits(text):
        reader = scanned(PythonArguments(2), pieces)
        assert (reader.out, reader.end, reader.error, reader.known) == (want, len(text), None,
                                                                       True), pieces


@pytest.mark.parametrize("text, at", NOT_CALLS)
def test_text_that_is_no_such_call_stops_where_it_breaks(text, at):
    assert reference(text) is None
    whole = scanned(PythonArguments(2), [text])
    assert (whole.error, whole.end) == (at, None)
    for pieces in splits(text):
        reader = scanned(PythonArguments(2), pieces)
        assert (reader.error, reader.out, reader.known) == (at, whole.out, whole.known), pieces


def test_a_keyword_given_twice_is_written_twice_and_reads_as_vllm_reads_the_call():
    """vLLM reads a pythonic call with ``ast.parse``, which takes a keyword
    given twice (only compiling the call is an error), into a dict: each
    keyword's last value at its first place, here {"a": 3, "b": 2}.
    Written twice, what streams never changes, and ``json.loads`` reads
    the text as that dict."""
    text = "f(a=1, b=2, a=3)"
    ast.parse(text)
    for pieces in splits(text):
        reader = scanned(PythonArguments(2), pieces)
        assert (reader.out, reader.end, reader.error) == ('{"a": 1, "b": 2, "a": 3}', len(text),
                                                          None)
        assert list(json.loads(reader.out).items()) == [("a", 3), ("b", 2)]


def test_a_call_is_known_once_its_first_value_begins():
    for text, known in [("f(a", False), ("f(a=", False), ("f(a=1", False), ("f(a=1,", True),
                        ("f(a='", False), ("f(a='x", True), ("f(a=[", True), ("f(a=Tru", False), ("f()", True)]:
        reader = PythonArguments(2)
        reader.scan(StreamedText(text))  # more may come
        assert reader.known is known, text



def test_a_dict_key_python_holds_equal_to_an_earlier_one_takes_its_spelling():
    """Python holds ``True``, ``1`` and ``1.0`` one key (``False``, ``0``
    and ``0.0`` another; ``"1"`` and ``None`` are keys of their own): the
    dict vLLM builds has one member for them, the first key with the last
    value, which ``json.dumps`` writes under the first key's spelling. A
    later equal key is written with that spelling, so ``json.loads`` reads
    the text as ``json.dumps`` writes the dict ``ast.literal_eval`` reads."""
    text = ("f(a={True: 1, 1: 'x', 1.0: None, '1': 2}, b=[{0.0: 1, False: {1: 2, True: 3}}],"
            " c={None: 1, 2: 2, None: 3, 2.0: 4})")
    written = ('{"a": {"true": 1, "true": "x", "true": null, "1": 2}, '
               '"b": [{"0.0": 1, "0.0": {"1": 2, "1": 3}}], '
               '"c": {"null": 1, "2": 2, "null": 3, "2": 4}}')
    call = ast.parse(text, mode="eval").body
    python = json.dumps({k.arg: ast.literal_eval(k.value) for k in call.keywords})
    assert python == ('{"a": {"true": null, "1": 2}, "b": [{"0.0": {"1": 3}}], '
                      '"c": {"null": 3, "2": 4}}')
    for pieces in splits(text):
        reader = scanned(PythonArguments(2), pieces)
        assert (reader.out, reader.end, reader.error) == (written, len(text), None), pieces
        assert json.dumps(json.loads(reader.out)) == python
