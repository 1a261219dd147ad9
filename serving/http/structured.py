"""A request's structured-output constraint, from the fields clients send.

Accepted spellings (at most one constraint per request, else HTTP 400):
OpenAI's ``response_format`` (``{"type": "text"}``, ``{"type":
"json_object"}``, ``{"type": "json_schema", "json_schema": {"name",
"schema", "strict"}}``), vLLM's ``structured_outputs`` object (``json``,
``regex``, ``choice``, ``grammar``, ``json_object``,
``disable_any_whitespace``) and vLLM's older ``guided_json``,
``guided_regex``, ``guided_choice`` and ``guided_grammar``. The result is
the ``structured_outputs`` entry of the engine's sampling parameters, whose
own checks then apply; whether it compiles is the engine's verdict.
"""

from __future__ import annotations

from typing import Any

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def structured_outputs_of(request) -> dict[str, Any] | None:
    """The constraint as a ``StructuredOutputsParams`` dict, or None."""
    found: list[tuple[str, dict[str, Any]]] = []
    response_format = _from_response_format(request.response_format)
    if response_format is not None:
        found.append(("response_format", response_format))
    if request.structured_outputs is not None:
        if not isinstance(request.structured_outputs, dict):
            raise ValueError("structured_outputs must be an object")
        found.append(("structured_outputs", dict(request.structured_outputs)))
    for field, kind in _GUIDED.items():
        value = getattr(request, field)
        if value is not None:
            found.append((field, {kind: value}))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise ValueError(f"give one structured-output constraint per request, got {names}")
    return found[0][1] if found else None


def _from_response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ValueError("response_format must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ValueError('response_format {"type": "json_schema"} needs '
                             '"json_schema": {"name": ..., "schema": {...}}')
        return {"json": spec["schema"]}
    raise ValueError(f"response_format type must be text, json_object or json_schema, "
                     f"got {kind!r}")
