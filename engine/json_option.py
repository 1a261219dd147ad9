"""An option whose value is a JSON object: given as a dict (Python) or as
the object's JSON text (a command line)."""

from __future__ import annotations

import json


def json_object(value: dict | str, name: str) -> dict:
    """``value`` as a dict; ``ValueError`` naming the option ``name`` (one
    line) for text that is not JSON or JSON that is not an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{name} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object, got {value!r}")
    return value
