"""Regexes that end in a lone backslash, in a regex constraint or a JSON schema.

A regex whose last backslash escapes nothing (``a\\``) is not a regex, but
llguidance's regex-to-grammar step drops that backslash before it parses:
``a\\`` compiles as ``a`` and a lone ``\\`` as the empty regex, which
matches anything, instead of failing. It does so for a regex constraint and
for the regexes of a JSON schema (a structural tag's included) alike: a
string's ``pattern`` and the keys of ``patternProperties``, wherever the
schema nests them (its properties, items, ``$defs``, ``anyOf`` members,
...). ``format`` takes only the names
of llguidance's fixed formats, never a regex. ``dangling_escape`` finds
such a regex so the backend refuses the constraint before compiling it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from engine.structured_outputs import structural_tags
from engine.structured_outputs.params import GrammarKey

# Keywords whose value is a schema, or a list of schemas (a JSON schema's
# subschemas): the walk goes into these and nothing else, so data (``enum``,
# ``const``, ``default``, ``examples``) is never read as a schema.
_SCHEMA = ("items", "additionalItems", "additionalProperties", "unevaluatedProperties",
           "unevaluatedItems", "contains", "propertyNames", "not", "if", "then", "else")
_SCHEMA_LISTS = ("items", "prefixItems", "anyOf", "oneOf", "allOf")
# Keywords whose value maps names (or, for patternProperties, regexes) to schemas.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                "dependentSchemas", "dependencies")


def ends_in_lone_backslash(regex: str) -> bool:
    """Whether ``regex`` ends in a backslash that escapes nothing (an odd
    run of them at its end)."""
    return (len(regex) - len(regex.rstrip("\\"))) % 2 == 1


def dangling_escape(key: GrammarKey) -> str | None:
    """Why ``key`` would lose a backslash in llguidance (its regex, or a
    JSON schema's or a structural tag's first such regex named with its
    place), or None."""
    if key.kind == "regex" and ends_in_lone_backslash(key.text):
        return "it ends in an incomplete escape (a lone backslash)"
    if key.kind == "json":
        places = [("#", json.loads(key.text))]
    elif key.kind == "structural_tag":
        places = structural_tags.schemas(key.text)
    else:
        return None
    for where, regex in (found for root, schema in places
                         for found in schema_regexes(schema, root)):
        if ends_in_lone_backslash(regex):
            return (f"the pattern {json.dumps(regex)} at {where} ends in an incomplete "
                    f"escape (a lone backslash)")
    return None


def schema_regexes(schema: Any, where: str = "#") -> Iterator[tuple[str, str]]:
    """Every regex of ``schema`` with its JSON pointer: each ``pattern``
    (a string's) and each key of ``patternProperties``, in the schema and
    in its subschemas at any depth."""
    if not isinstance(schema, dict):
        return
    if isinstance(schema.get("pattern"), str):
        yield f"{where}/pattern", schema["pattern"]
    if isinstance(schema.get("patternProperties"), dict):
        for regex in schema["patternProperties"]:
            yield f"{where}/patternProperties/{_pointer_token(regex)}", regex
    for word, value in schema.items():
        inside = f"{where}/{_pointer_token(word)}"
        if word in _SCHEMA_LISTS and isinstance(value, list):
            for i, member in enumerate(value):
                yield from schema_regexes(member, f"{inside}/{i}")
        elif word in _SCHEMA:
            yield from schema_regexes(value, inside)
        elif word in _SCHEMA_MAPS and isinstance(value, dict):
            for name, member in value.items():
                yield from schema_regexes(member, f"{inside}/{_pointer_token(name)}")


def _pointer_token(name: str) -> str:
    """``name`` as one token of a JSON pointer (``~`` and ``/`` escaped)."""
    return name.replace("~", "~0").replace("/", "~1")
