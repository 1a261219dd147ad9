"""Tool definitions held to a depth before anything walks them.

A chat's ``tools`` (OpenAI's tool dicts) reach the chat template, which
writes them with ``tojson`` (``json.dumps``) or prints them, and on the
HTTP server a named or required tool choice copies each tool's
``parameters`` (``tools.moved_refs``) and compiles it as a structured-output
schema. Each of those walks recurses once or more per nested container, so
a definition nested near Python's recursion limit would end one of them
with ``RecursionError`` deep inside instead of a clear refusal (the HTTP
body reader stops at about 200 levels; ``LLM.chat`` takes any Python
value). So ``check_tool_depth`` measures every tool first with
``schema_depth.nesting_depth``, which never recurses, and refuses one
nested deeper than ``MAX_TOOL_DEPTH``: an ``InvalidRequestError`` naming
``tools`` (HTTP 400).

The bound is a structured-outputs schema's (``MAX_SCHEMA_DEPTH``) with the
two objects that hold ``parameters`` in the chat's spelling around it (the
tool, its ``function``): a tool whose parameters nest as deep as a schema
may is taken, as deep as a named tool choice can hold the output to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.structured_outputs.schema_depth import MAX_SCHEMA_DEPTH, nesting_depth
from ipc.errors import InvalidRequestError

# The tool object and its "function" object around a parameters schema.
MAX_TOOL_DEPTH = MAX_SCHEMA_DEPTH + 2


def check_tool_depth(tools: Sequence[Any] | None) -> None:
    """``InvalidRequestError`` naming ``tools`` when one of ``tools`` (the
    definitions as given, the chat's spelling) nests objects and arrays
    more than ``MAX_TOOL_DEPTH`` deep; nothing for None or shallower ones."""
    for i, tool in enumerate(tools or ()):
        if nesting_depth(tool, MAX_TOOL_DEPTH) > MAX_TOOL_DEPTH:
            raise InvalidRequestError(
                f"tools.{i} nests objects and arrays more than {MAX_TOOL_DEPTH} levels deep: "
                f"a tool's parameters schema may nest at most {MAX_SCHEMA_DEPTH} levels, as a "
                "structured-outputs schema may", param="tools")
