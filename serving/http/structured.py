"""A request's structured-output constraint, from the fields clients send.

Accepted spellings (at most one constraint per request, else HTTP 400):
OpenAI's ``response_format`` (``{"type": "text"}``, ``{"type":
"json_object"}``, ``{"type": "json_schema", "json_schema": {"name",
"schema", "strict"}}``, and vLLM's ``{"type": "structural_tag",
"structures": [{"begin", "schema", "end"}], "triggers": [...]}``, which
becomes the engine's ``structural_tag`` as its JSON text, as vLLM passes
it), vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``,
``grammar``, ``json_object``, ``structural_tag``,
``disable_any_whitespace``) and vLLM's older ``guided_json``,
``guided_regex``, ``guided_choice`` and ``guided_grammar``. The result is
the ``structured_outputs`` entry of the engine's sampling parameters. Its
shape is checked here with the engine's own rules, and a bad value is a
``FieldError`` named by the field the client sent it in
(``response_format.json_schema.schema``, ``guided_json``,
``response_format.structures[0].begin``, ...), never by the engine's key;
whether it compiles is the engine's verdict.

The Responses API spells its constraint ``text.format`` (``{"type":
"json_schema", "name", "schema", "strict"}``, the schema beside the name,
or ``{"type": "json_object"}``): ``text_format_constraint``.
"""

from __future__ import annotations

import json
from typing import Any

from engine.structured_outputs.params import StructuredOutputsError, StructuredOutputsParams
from engine.structured_outputs.schema_depth import MAX_SCHEMA_DEPTH, nesting_depth
from ipc.errors import InvalidRequestError
from serving.http.protocol import FieldError

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}
_SCHEMA = "response_format.json_schema.schema"


def constraint_fields(request) -> list[str]:
    """The request's fields that carry a structured-output constraint (a
    ``response_format`` of type text carries none)."""
    return [name for name, _, _ in _constraints_of(request)]


def structured_outputs_of(request) -> StructuredOutputsParams | None:
    """The constraint, checked once here (``SamplingParams`` takes it as it
    is), or None."""
    found = _constraints_of(request)
    if len(found) > 1:
        names = ", ".join(name for name, _, _ in found)
        raise InvalidRequestError(f"give one structured-output constraint per request, got "
                                  f"{names}")
    if not found:
        return None
    name, constraint, paths = found[0]
    try:
        return StructuredOutputsParams.from_dict(constraint)
    except StructuredOutputsError as e:
        where = _field_path(e.key, name, paths)
        raise FieldError(where, f"{where} {e.problem}") from None


def _field_path(key: str, name: str, paths: dict[str, str]) -> str:
    """The field the client sent an engine key (or a part under it:
    ``structural_tag.structures[0].begin``) in."""
    head, dot, rest = key.partition(".")
    if head in paths:
        return paths[head] + dot + rest
    return f"{name}.{key}"


def _constraints_of(request) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """(the field it came in, the constraint, the field path of each engine
    key) for each constraint the request gives."""
    found: list[tuple[str, dict[str, Any], dict[str, str]]] = []
    response_format = _from_response_format(request.response_format)
    if response_format is not None:
        found.append(("response_format", response_format,
                      {"json": _SCHEMA, "structural_tag": "response_format"}))
    if request.structured_outputs is not None:
        if not isinstance(request.structured_outputs, dict):
            raise FieldError("structured_outputs", "structured_outputs must be an object")
        found.append(("structured_outputs", dict(request.structured_outputs), {}))
    for field, kind in _GUIDED.items():
        value = getattr(request, field)
        if value is not None:
            found.append((field, {kind: value}, {kind: field}))
    return found


def _from_response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise FieldError("response_format", "response_format must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "structural_tag":
        if nesting_depth(fmt) > MAX_SCHEMA_DEPTH + 3:  # its schemas, three levels in
            raise FieldError("response_format", f"response_format nests a schema more than "
                                                f"{MAX_SCHEMA_DEPTH} levels deep")
        return {"structural_tag": json.dumps(fmt)}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise FieldError("response_format.json_schema",
                             'response_format {"type": "json_schema"} needs '
                             '"json_schema": {"name": ..., "schema": {...}}')
        if spec["schema"] is None or spec["schema"] is False:
            # The engine reads a json of None or False as no constraint at all.
            raise FieldError(_SCHEMA, f"{_SCHEMA} must be a JSON schema (an object), "
                                      f"got {json.dumps(spec['schema'])}")
        return {"json": spec["schema"]}
    raise FieldError("response_format.type",
                     f"response_format type must be text, json_object, json_schema or "
                     f"structural_tag, got {kind!r}")


def text_format_constraint(fmt: dict[str, Any] | None) -> StructuredOutputsParams | None:
    """The constraint of a Responses request's ``text.format`` (None for
    none or ``{"type": "text"}``); ``FieldError`` named by its path under
    ``text.format``."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams.from_dict({"json_object": True})
    if kind != "json_schema":
        raise FieldError("text.format.type", f"text.format type must be text, json_object or "
                                             f"json_schema, got {kind!r}")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise FieldError("text.format.schema",
                         'text.format {"type": "json_schema"} needs "schema": a JSON schema '
                         f"(an object), got {json.dumps(schema)}")
    try:
        return StructuredOutputsParams.from_dict({"json": schema})
    except StructuredOutputsError as e:
        raise FieldError("text.format.schema", f"text.format.schema {e.problem}") from None
