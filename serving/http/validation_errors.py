"""A request body's validation errors as one 400 a client can act on.

Pydantic answers a value that fits no member of a union field (``prompt``,
``stop``, a message's ``content``) with one error per member, each located
under the member's label (``("prompt", "list[constrained-int]", 1)``).
The first of them blames the first member, which the client may never have
meant: a list of token ids with one bad id read "prompt: Input should be a
valid string". ``explain`` reads the errors of the first error's union
together instead, by one rule:

- the member that got furthest into the value wins: its first error lies
  furthest along a walk of the value (a later list index, else a deeper
  place), and at the same place a bad value beats a wrong type (the member
  took the value's type there: ``[2**63]`` is a list of integers with one
  out of range). Inside a winner that holds another union (a Responses
  ``input`` list, each item's ``content``) the rule applies again;
- the message names where that error is and pydantic's words for it, then
  what the innermost union around it accepts, described from the types
  ("prompt.1: Input should be a valid integer, ... (prompt accepts a
  string, a list of strings, a list of integers or a list of lists of
  integers)"); when every member failed on the value's type at the union
  itself, the message is what the field accepts and what it got
  ("input.0.content: Input should be a string or a list of content parts,
  got an integer"). A wrong type below the union is named in the same
  words: what was expected there, and what came.

Errors outside any union keep pydantic's message. ``param`` is the path the
message starts with. Invariant: an error's location is read against the
request model's types (``read_location``), so a union's labels are told from
field names and dict keys (a dict key, any text the client chose, is left
out of the path); where the types are unknown (a query parameter) every
name is a field.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

Kind = Literal["field", "index", "key", "member"]
_SCALARS = {str: ("a string", "strings"), int: ("an integer", "integers"),
            float: ("a number", "numbers"), bool: ("a boolean", "booleans")}


@dataclass(frozen=True)
class Place:
    """One step of an error's location: a model's field, a list index, a
    dict key, or the label of the union member pydantic tried
    (``members``: that union's member types). ``expected``: the type of
    the value there (None: unknown)."""

    kind: Kind
    part: str | int
    expected: Any = None
    members: tuple = ()


@dataclass(frozen=True)
class Explained:
    message: str
    param: str | None


def explain(errors: Sequence[dict], model: type[BaseModel] | None) -> Explained:
    """One message and ``param`` for pydantic's ``errors`` of a body
    validated against ``model`` (None: types unknown); locations start
    below the body."""
    if not errors:
        return Explained("body: invalid request", None)
    read = [(error, read_location(model, error["loc"])) for error in errors]
    first, places = read[0]
    at = _next_member(places, 0)
    if at is None:
        where = path_of(places)
        return Explained(f"{where or 'body'}: {first['msg']}", where or None)
    union = [(e, p) for e, p in read if _same_union(p, places, at)]
    error, places, at = _furthest(union, at)
    where, union_path = path_of(places), path_of(places[:at])
    forms = _join([_form(m)[0] for m in places[at].members])
    if at == len(places) - 1 and _is_type_mismatch(error):  # no member took the value's type
        message = f"Input should be {forms}, got {_json_kind(error.get('input'))}"
        return Explained(f"{where or 'body'}: {message}", where or None)
    message = error["msg"]
    if _is_type_mismatch(error) and places[-1].expected is not None:
        message = (f"Input should be {_form(places[-1].expected)[0]}, "
                   f"got {_json_kind(error.get('input'))}")
    return Explained(f"{where or 'body'}: {message} ({union_path or 'the body'} accepts {forms})",
                     where or None)


def path_of(places: Sequence[Place]) -> str:
    """The client's path to a place: field names and list indices, by dots."""
    return ".".join(str(p.part) for p in places if p.kind in ("field", "index"))


def read_location(model: type[BaseModel] | None, loc: Sequence[str | int]) -> list[Place]:
    """``loc`` step by step against the types from ``model`` down."""
    places: list[Place] = []
    annotation: Any = model
    for part in loc:
        if part == "[key]":  # pydantic's mark of an error in a dict's key, after the key
            places.append(Place("key", part))
            continue
        bare = _bare(annotation)
        members = _members(bare)
        if members:
            annotation = next((m for m in members if _label(m) == part), None)
            places.append(Place("member", part, annotation, members))
        elif _is_model(bare) and part in bare.model_fields:
            annotation = bare.model_fields[part].annotation
            places.append(Place("field", part, annotation))
        elif typing.get_origin(bare) is list and isinstance(part, int):
            annotation = typing.get_args(bare)[0]
            places.append(Place("index", part, annotation))
        elif typing.get_origin(bare) is dict:
            annotation = typing.get_args(bare)[1]
            places.append(Place("key", part, annotation))
        else:  # below types unknown (Any, a model's extra field): as the client named it
            annotation = None
            places.append(Place("index" if isinstance(part, int) else "field", part))
    return places


def _next_member(places: Sequence[Place], start: int) -> int | None:
    return next((i for i in range(start, len(places)) if places[i].kind == "member"), None)


def _same_union(places: Sequence[Place], union: Sequence[Place], at: int) -> bool:
    """Whether ``places`` lie in the union at ``union[at]`` (any of its members)."""
    return (len(places) > at and places[at].kind == "member"
            and [p.part for p in places[:at]] == [p.part for p in union[:at]])


def _furthest(union: list[tuple[dict, list[Place]]], at: int) -> tuple[dict, list[Place], int]:
    """The first error of the member that got furthest (module docstring),
    its places and the position of its innermost union's label."""
    firsts: dict[str | int, tuple[dict, list[Place]]] = {}
    for error, places in union:
        firsts.setdefault(places[at].part, (error, places))
    error, places = max(firsts.values(), key=_reach)  # the first member among equals
    inner = _next_member(places, at + 1)
    if inner is None:
        return error, places, at
    member = [(e, p) for e, p in union if p[at].part == places[at].part]
    return _furthest([(e, p) for e, p in member if _same_union(p, places, inner)], inner)


def _reach(read: tuple[dict, list[Place]]) -> tuple:
    """How far into the value an error lies: list indices in order (a field
    or key counts as 0, so a later item beats a deeper place in an earlier
    one, and a deeper place beats its parent), then a bad value over a
    wrong type."""
    error, places = read
    steps = tuple(p.part if p.kind == "index" else 0 for p in places if p.kind != "member")
    return steps, not _is_type_mismatch(error)


def _is_type_mismatch(error: dict) -> bool:
    """A value of another type than the one asked for (``string_type``,
    ``int_parsing`` for a text that is no integer, ``model_type``)."""
    return error.get("type", "").endswith(("_type", "_parsing"))


def _bare(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` metadata, and a union of one
    type and None as that type (pydantic gives nullable fields no label)."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if _is_union(annotation):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _bare(args[0])
    return annotation


def _members(annotation: Any) -> tuple:
    """The members of a union of two types or more (None left out)."""
    if not _is_union(annotation):
        return ()
    members = tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return members if len(members) > 1 else ()


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _label(annotation: Any) -> str | None:
    """pydantic-core's label for a union member of this type (None for a
    type this reader does not spell; that member's errors then read as
    unknown types)."""
    constrained = False
    while typing.get_origin(annotation) is Annotated:
        annotation, *meta = typing.get_args(annotation)
        constrained |= any(not isinstance(m, FieldInfo) or m.metadata for m in meta)
    if annotation in _SCALARS:
        return f"constrained-{annotation.__name__}" if constrained else annotation.__name__
    if annotation is Any:
        return "any"
    if _is_model(annotation):
        return annotation.__name__
    args = [_label(a) for a in typing.get_args(annotation)]
    if None in args:
        return None
    if typing.get_origin(annotation) is list:
        return f"list[{args[0]}]"
    if typing.get_origin(annotation) is dict:
        return f"dict[{args[0]},{args[1]}]"
    return None


def _form(annotation: Any) -> tuple[str, str]:
    """How a type is named to a client: one, and several ("a list of
    integers", "lists of integers"). A title (``Field(title=...)`` on the
    type, a model's ``model_config`` title) names it; an untitled model or
    dict is an object."""
    title = None
    while typing.get_origin(annotation) is Annotated:
        annotation, *meta = typing.get_args(annotation)
        title = title or next((m.title for m in meta if isinstance(m, FieldInfo) and m.title),
                              None)
    if title is None and _is_model(annotation):
        title = annotation.model_config.get("title")
    if title:
        return f"{'an' if title[0] in 'aeiou' else 'a'} {title}", f"{title}s"
    annotation = _bare(annotation)
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if typing.get_origin(annotation) is list:
        several = _form(typing.get_args(annotation)[0])[1]
        return f"a list of {several}", f"lists of {several}"
    if _is_model(annotation) or annotation is dict or typing.get_origin(annotation) is dict:
        return "an object", "objects"
    if _members(annotation):
        return _join([_form(m)[0] for m in _members(annotation)]), "values"
    return "a value", "values"


def _join(forms: list[str]) -> str:
    return forms[0] if len(forms) == 1 else f"{', '.join(forms[:-1])} or {forms[-1]}"


def _json_kind(value: Any) -> str:
    """What a JSON value is, in the words of ``_form``."""
    if value is None:
        return "null"
    for kind, words in ((bool, "a boolean"), (int, "an integer"), (float, "a number"),
                        (str, "a string"), (list, "a list"), (dict, "an object")):
        if isinstance(value, kind):
            return words
    return type(value).__name__
