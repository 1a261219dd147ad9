"""``StructuredOutputsParams``: the constraint on one request's output, with vLLM's names.

Exactly one constraint per request: ``json`` (a JSON schema, as a dict or
its text), ``regex``, ``choice`` (a list of strings), ``grammar`` (Lark or
GBNF text), ``json_object=True`` (any JSON object) or ``structural_tag``
(the JSON text of tagged JSON values in free text: ``structural_tags``).
``__post_init__`` checks the shape (types, exactly one) and raises
``InvalidRequestError`` (a ``StructuredOutputsError`` naming the key when
one key's value is bad, so a front end can name the field its user sent
instead); whether a schema, regex or grammar compiles is decided by the grammar backend when the
request enters the engine, except a schema nested deeper than
``MAX_SCHEMA_DEPTH`` (``schema_depth``), refused here, before anything
walks it. ``disable_any_whitespace`` makes JSON compact (no
whitespace between tokens of the JSON text), as vLLM's option of that name.

A JSON schema is compiled with its objects closed (``closed_objects``): an
object schema that lists ``properties`` and says nothing of
``additionalProperties`` gets ``false``, so the output holds only the keys
the schema names, as vLLM's default backend (xgrammar's strict mode) and
OpenAI's structured outputs give it. Without that a grammar lets a model add
keys of its own after the named ones, which breaks the usual
``fn(**json.loads(arguments))`` of tool calls. A schema that wants other
keys says so (``"additionalProperties": true`` or a schema). One that
requires a key its ``properties`` do not name (which only an additional
property can give) stays open, and so does one whose keys other schemas
extend (``allOf``, ``anyOf`` beside its properties, ``$ref``,
``if``/``then``), as do those schemas.

``key`` is the compiled grammar's identity: two parameters with the same key
share one compiled grammar (the compile cache is keyed by it).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any

from engine.structured_outputs import structural_tags
from engine.structured_outputs.errors import StructuredOutputsError
from engine.structured_outputs.schema_depth import (
    MAX_SCHEMA_DEPTH,
    nesting_depth,
    text_nesting_depth,
)
from ipc.errors import InvalidRequestError

_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(frozen=True)
class GrammarKey:
    """What the backend compiles: the kind and a canonical text."""

    kind: str  # "json" (json_object too), "regex", "choice", "grammar" or "structural_tag"
    text: str
    compact_json: bool = False


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        given = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequestError(
                "structured_outputs needs exactly one of json, regex, choice, grammar, "
                f"json_object, structural_tag; got {', '.join(given) if given else 'none'}")
        if self.json is not None:
            object.__setattr__(self, "json", _schema_text(self.json))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise StructuredOutputsError(name, "must be a non-empty string")
        if self.choice is not None:
            _check_choice(self.choice)
            object.__setattr__(self, "choice", tuple(self.choice))
        if self.structural_tag is not None:
            object.__setattr__(self, "structural_tag", structural_tags.canonical(
                self.structural_tag))
        if self.json_object not in (None, True, False):
            raise StructuredOutputsError("json_object", "must be a bool")
        if not isinstance(self.disable_any_whitespace, bool):
            raise StructuredOutputsError("disable_any_whitespace", "must be a bool")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StructuredOutputsParams:
        """From a plain mapping (HTTP bodies, engine messages); unknown keys
        raise ``InvalidRequestError`` naming them. Keys set to None are
        ignored."""
        if not isinstance(d, dict):
            raise InvalidRequestError(
                f"structured_outputs must be an object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in d if k not in known)  # keys of any type
        if unknown:
            raise InvalidRequestError(f"unknown structured_outputs field(s): {', '.join(unknown)}; "
                                      f"known: {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in d.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        """The set fields, as ``from_dict`` reads them (JSON-serialisable)."""
        out = {k: getattr(self, k) for k in _KINDS if getattr(self, k) not in (None, False)}
        if "choice" in out:
            out["choice"] = list(out["choice"])
        if self.disable_any_whitespace:
            out["disable_any_whitespace"] = True
        return out

    @functools.cached_property
    def key(self) -> GrammarKey:
        compact = self.disable_any_whitespace
        if self.json is not None:
            schema = closed_objects(json.loads(self.json))
            if schema is True:  # llguidance takes an object at the root: the same, empty
                schema = {}
            return GrammarKey("json", json.dumps(schema, separators=(",", ":")), compact)
        if self.json_object:
            return GrammarKey("json", '{"type":"object"}', compact)
        if self.regex is not None:
            return GrammarKey("regex", self.regex)
        if self.choice is not None:
            return GrammarKey("choice", json.dumps(list(self.choice)))
        if self.structural_tag is not None:
            return GrammarKey("structural_tag",
                              structural_tags.closed(self.structural_tag, closed_objects), compact)
        return GrammarKey("grammar", self.grammar)


def _schema_text(schema: Any) -> str:
    """A JSON schema's text without spaces (key order kept: it is the order
    of the output's properties), from a dict or from text that parses to an
    object (or the boolean schema true, which any value satisfies). One
    nested deeper than ``MAX_SCHEMA_DEPTH`` is refused before it is parsed
    or written (``schema_depth``: no walk of it may recurse that deep)."""
    if isinstance(schema, str):
        _check_depth(text_nesting_depth(schema))
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise StructuredOutputsError("json", f"is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise StructuredOutputsError("json", "must be a JSON schema (an object), got "
                                     f"{type(schema).__name__}")
    _check_depth(nesting_depth(schema))
    if schema is False:
        raise StructuredOutputsError("json", "is the schema false, which no value satisfies")
    try:
        return json.dumps(schema, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise StructuredOutputsError("json", f"cannot be written as JSON: {e}") from None


def _check_depth(depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise StructuredOutputsError(
            "json", f"nests objects and arrays more than {MAX_SCHEMA_DEPTH} levels deep; a "
            f"JSON schema may nest at most {MAX_SCHEMA_DEPTH} (the deepest the grammar "
            "backend reads)")


# Keywords whose value describes another instance than the schema's own (an
# item, a property's value, a key): a schema, a list of schemas, or a map of
# names to schemas.
_OTHER_INSTANCE = ("items", "additionalItems", "additionalProperties", "unevaluatedProperties",
                   "unevaluatedItems", "contains", "propertyNames", "prefixItems")
_OTHER_INSTANCE_MAPS = ("properties", "patternProperties", "$defs", "definitions")
# Keywords whose schemas describe the same instance as the schema itself: they
# may add keys of their own, so where the schema names properties, neither it
# nor they are closed (closing one would forbid the other's keys).
_SAME_INSTANCE = ("anyOf", "oneOf", "allOf", "then", "else", "dependentSchemas")
# Left as given: a condition or a negation closed would match other instances.
_LEFT = ("not", "if")


def closed_objects(schema: Any, composed: bool = False) -> Any:
    """A copy of ``schema`` in which every object schema that has
    ``properties`` and no ``additionalProperties`` gets ``false``, except one
    that requires a key its properties do not name, one
    whose keys other schemas may add to (a ``$ref``, ``if``, or a
    ``_SAME_INSTANCE`` keyword beside its properties), and the schemas that
    add to one (``composed``: an ``allOf`` member always, the others where
    the schema they sit in names properties). ``not`` and ``if`` are left as
    given, and so is data (``enum``, ``const``, ``default``, ...)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    names_keys = "properties" in schema
    for word, value in schema.items():
        if word in _LEFT:
            continue
        if word in _OTHER_INSTANCE:
            out[word] = ([closed_objects(s) for s in value] if isinstance(value, list)
                         else closed_objects(value))
        elif word in _OTHER_INSTANCE_MAPS and isinstance(value, dict):
            out[word] = {name: closed_objects(s) for name, s in value.items()}
        elif word in _SAME_INSTANCE:
            adds = names_keys or word == "allOf"
            if isinstance(value, list):
                out[word] = [closed_objects(s, composed=adds) for s in value]
            elif word == "dependentSchemas" and isinstance(value, dict):
                out[word] = {name: closed_objects(s, composed=True) for name, s in value.items()}
            else:
                out[word] = closed_objects(value, composed=adds)
    extended = any(word in out for word in (*_SAME_INSTANCE, "$ref", "if"))
    if (not composed and names_keys and "additionalProperties" not in out and not extended
            and not _requires_unnamed_keys(schema)):
        out["additionalProperties"] = False
    return out


def _requires_unnamed_keys(schema: dict) -> bool:
    """Whether ``schema`` requires a key its ``properties`` do not name: one
    that only an additional property can give, so closing the object would
    leave nothing that satisfies it."""
    required, properties = schema.get("required"), schema.get("properties")
    if not isinstance(required, list) or not isinstance(properties, dict):
        return False
    return any(name not in properties for name in required)


def _check_choice(choice: Any) -> None:
    if isinstance(choice, (str, bytes)) or not hasattr(choice, "__iter__"):
        raise StructuredOutputsError("choice", "must be a list of strings")
    items = list(choice)
    if not items:
        raise StructuredOutputsError("choice", "must not be empty")
    if not all(isinstance(c, str) and c for c in items):
        raise StructuredOutputsError("choice", "must hold non-empty strings")
