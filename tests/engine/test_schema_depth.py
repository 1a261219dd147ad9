"""``schema_depth``: how deep a JSON value nests, measured without recursion,
against a plain recursive count of the same values (the reference), on
values drawn by hypothesis whose strings hold brackets, quotes and
backslashes, and on hand-worked texts that ``json.loads`` reads only in
part or not at all."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.structured_outputs.schema_depth import (
    MAX_SCHEMA_DEPTH,
    nesting_depth,
    text_nesting_depth,
)

_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\ ,:ab\n\u00e9'), max_size=8)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=40)


def reference_depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(reference_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(reference_depth, value), default=0)
    return 0


@settings(max_examples=400, deadline=None)
@given(_VALUES, st.sampled_from([None, 2]), st.booleans())
def test_both_measures_match_a_recursive_count(value, indent, ensure_ascii):
    want = reference_depth(value)
    assert nesting_depth(value) == want
    assert text_nesting_depth(json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)) == want


def test_hand_worked_texts():
    assert text_nesting_depth("") == 0
    assert text_nesting_depth("3") == 0
    assert text_nesting_depth('"[[{"') == 0  # brackets inside a string are text
    assert text_nesting_depth(r'["\"]]", [[]]]') == 3  # an escaped quote does not end it
    assert text_nesting_depth(r'["\\", [[]]]') == 3  # an escaped backslash does
    assert text_nesting_depth('[["abc') == 2  # a string that never ends runs to the end
    assert text_nesting_depth('[["abc\\') == 2  # ... also after a lone backslash
    assert text_nesting_depth("[] [] {}") == 1
    assert text_nesting_depth("[" * 5000) == 5000  # past Python's recursion limit


def test_a_value_that_holds_itself_ends_past_the_limit():
    cyclic: dict = {"type": "object"}
    cyclic["properties"] = {"self": cyclic, "list": [cyclic]}
    assert nesting_depth(cyclic) == MAX_SCHEMA_DEPTH + 1
    assert nesting_depth(cyclic, limit=3) == 4
    deep: dict = {}
    for _ in range(10_000):
        deep = {"items": deep}
    assert nesting_depth(deep) == MAX_SCHEMA_DEPTH + 1  # stops there, past the limit


@pytest.mark.timeout(60)
def test_the_text_scan_is_linear_on_strings_that_never_close():
    """Quotes that are all escaped, in a string that never ends: each is
    read once (a scan that tried a string at each would take quadratic
    time here, past the test's time limit)."""
    text = '"' + '\\"' * 1_000_000 + "\\"
    assert text_nesting_depth(text) == 0
