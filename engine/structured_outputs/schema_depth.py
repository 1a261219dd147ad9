"""How deep a JSON schema nests, measured without recursion.

A schema's depth is the most objects and arrays nested in one another in
its JSON (``{}`` alone: 1; ``{"items": {}}``: 2). llguidance, the grammar
backend, reads a schema with serde_json, whose recursion limit (128) stops
at the 128th nested container, and reads it inside its grammar, three
containers deep (``{"grammars": [{"json_schema": SCHEMA}]}``): a schema
deeper than 124 never compiles. Python's own
walks of a schema (``json.loads``, ``json.dumps``, ``closed_objects``, the
regex scan of ``dangling_escape``) recurse once or twice a level, so one
nested near Python's recursion limit (about 1000 frames, less on a deep
stack) would end them with ``RecursionError`` instead. A schema deeper
than ``MAX_SCHEMA_DEPTH`` is therefore refused before any of them runs,
with these two measures, which never recurse:

- ``nesting_depth``: of a Python value (dicts, lists and tuples); it stops
  going down past ``limit``, so a value that contains itself ends too.
- ``text_nesting_depth``: of JSON text, in one linear pass that reads
  strings as ``json.loads`` reads them (a bracket inside one is text), so
  as far as the text is JSON it measures what ``json.loads`` would build.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

# The deepest a schema may nest: as deep as llguidance reads one (127
# containers, its grammar's three around the schema among them), no deeper.
MAX_SCHEMA_DEPTH = 124

# What is not a bracket outside a string: a string (escapes and all, to the
# text's end where it is not closed) or a run of other characters. Each
# alternative matches from where it starts, without backtracking, so the
# pass is linear whatever the text.
_NOT_BRACKETS = re.compile(r'"(?:[^"\\]+|\\.|\\\Z)*+(?:"|\Z)|[^\[\]{}"]+', re.DOTALL)
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def nesting_depth(value: Any, limit: int = MAX_SCHEMA_DEPTH) -> int:
    """The most dicts and lists (or tuples) nested in one another in
    ``value`` (a scalar: 0); any number above ``limit`` means deeper than
    ``limit`` (the walk goes no further down)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def text_nesting_depth(text: str) -> int:
    """The most objects and arrays nested in one another in JSON ``text``
    (no container: 0), its strings' brackets left out."""
    brackets = _NOT_BRACKETS.sub("", text)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
