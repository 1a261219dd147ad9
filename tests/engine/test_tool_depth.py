"""``tool_depth.check_tool_depth``: a tool definition nested deeper than
``MAX_TOOL_DEPTH`` (a structured-outputs schema's bound, with the tool and
its ``function`` around the parameters) is an ``InvalidRequestError``
naming ``tools``; one at the bound, and no tools, pass. Depths hand-worked:
``{}`` is 1 level, each ``{"items": ...}`` around it one more."""

from __future__ import annotations

import pytest

from engine.structured_outputs.schema_depth import MAX_SCHEMA_DEPTH
from engine.tool_depth import MAX_TOOL_DEPTH, check_tool_depth
from ipc.errors import InvalidRequestError


def nested_schema(depth: int) -> dict:
    """A schema ``depth`` levels deep: ``{}`` inside ``depth - 1`` "items"."""
    schema: dict = {}
    for _ in range(depth - 1):
        schema = {"items": schema}
    return schema


def tool_with(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def test_parameters_as_deep_as_a_schema_may_nest_pass():
    assert MAX_TOOL_DEPTH == MAX_SCHEMA_DEPTH + 2 == 126
    check_tool_depth(None)
    check_tool_depth([])
    check_tool_depth([tool_with(nested_schema(3)), tool_with(nested_schema(MAX_SCHEMA_DEPTH))])


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH + 1, 5000])
def test_deeper_parameters_are_refused_naming_tools(depth):
    tools = [tool_with(nested_schema(2)), tool_with(nested_schema(depth))]
    with pytest.raises(InvalidRequestError, match=r"tools\.1 nests .* more than 126") as e:
        check_tool_depth(tools)
    assert e.value.param == "tools"


def test_a_tool_that_holds_itself_is_refused():
    parameters: dict = {"type": "object"}
    parameters["properties"] = {"self": parameters}
    with pytest.raises(InvalidRequestError) as e:
        check_tool_depth([tool_with(parameters)])
    assert e.value.param == "tools"
