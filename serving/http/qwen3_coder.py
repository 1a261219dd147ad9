"""``qwen3_coder``: the tool-call parser of Qwen3-Coder's XML call form
(``--tool-call-parser qwen3_coder``), under vLLM's name::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Oslo
    </parameter>
    <parameter=days>
    2
    </parameter>
    </function>
    </tool_call>

As the other parsers (``auto_calls.py``), an answer reads as ``content
before | a run of calls | content after``: the text before the first
``<tool_call>`` is content, then blocks with blank space between, each
one call; text that is not a block ends the run and is content from
there on. A block is ``<tool_call>``, blank space, ``<function=NAME>``
(a name without blank space, quotes, ``<``, ``>``, ``{`` or ``}``), its
parameters, ``</function>``, blank space and ``</tool_call>``. A block
without a function of a valid name is no call (content from its tag on).

A parameter is ``<parameter=KEY>`` and its value, which ends at the
first ``</parameter>`` (or, where the model left that out, at the next
``<parameter=`` or the ``</function>``), one line break at each end
dropped; text between parameters is skipped. Each value is read by the
type the tool's parameters schema gives its key, as vLLM's parser reads
it (``converted``). The call's ``arguments`` is the JSON text of the
object of its values, as ``json.dumps`` writes it (but for a key given
twice: both are kept, where vLLM keeps the last value).

Streamed as vLLM streams it: the call's first entry and its ``{`` once
its name is whole, each parameter's ``"key": value`` once its value has
ended, the ``}`` with the ``</function>``; an answer cut in a call ends
its arguments there (its last value as far as it came) and closes them.
A value ends at the first ``</parameter>``: unlike vLLM's parser, a value
holding that text (or ``<parameter=`` or ``</function>``) is cut there.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, ClassVar

from checkpoint.growing_text import GrowingText
from serving.http.auto_calls import BLANK, AutoCallsReader

_NAME = re.compile(r"[^\s\"'<>{}]+")
_STRINGS = ("string", "str", "text", "varchar", "char", "enum")
_INTEGERS = ("int", "uint", "long", "short", "unsigned")


class Qwen3CoderReader(AutoCallsReader):
    """States: "before" (content, up to the first ``<tool_call>``),
    "block" (after the tag at ``block_start``: the function's name),
    "function" (its parameters, from ``at``, up to its ``</function>``),
    "after_function" (at ``at``: blank space and the block's
    ``</tool_call>``), "between" (after a block, at ``at``)."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    FUNCTION, FUNCTION_END = "<function=", "</function>"
    PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"

    def __init__(self, tools: dict[str, dict] | None = None) -> None:
        super().__init__(tools)
        self.state = "before"
        self.at = 0
        self.block_start = 0
        self.properties: dict = {}  # the called tool's properties' schemas
        self.arguments = GrowingText()  # the open call's arguments so far

    STEPS: ClassVar[dict[str, str]] = {"before": "_before", "block": "_block",
                                       "function": "_function",
                                       "after_function": "_after_function",
                                       "between": "_between"}

    def _needed_from(self) -> int:
        return self.block_start if self.state == "block" else self.at

    def _open_block(self, tag: int | None) -> bool:
        if tag is None:
            return False
        self.state, self.block_start = "block", tag
        return True

    def _before(self, last: bool) -> bool:
        return self._open_block(self._say_until(self.OPEN, last))

    def _between(self, last: bool) -> bool:
        return self._open_block(self._next_tag(self.OPEN, last))

    def _block(self, last: bool) -> bool:
        """The block's ``<function=NAME>``: the call's first entry and its
        arguments' ``{``."""
        start = self._run_end(BLANK, self.block_start + len(self.OPEN))
        head = self.text[start:start + len(self.FUNCTION)]
        if head != self.FUNCTION:
            if last or not self.FUNCTION.startswith(head):
                self._rest_from(self.block_start)
            return False
        name_end = self._find(">", start + len(self.FUNCTION))
        if name_end < 0:
            if last:
                self._rest_from(self.block_start)
            return False
        name = self.text[start + len(self.FUNCTION):name_end]
        if _NAME.fullmatch(name) is None:
            self._rest_from(self.block_start)
            return False
        schema = self.tools.get(name)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        self.properties = properties if isinstance(properties, dict) else {}
        self.arguments = GrowingText()  # the new call's, and what it is read from
        self.arguments.add("{")
        self._entries(self.list.follow(self.arguments, name, self.arguments.span))
        self.state, self.at = "function", name_end + 1
        return True

    def _function(self, last: bool) -> bool:
        """The function's body from ``at``: its next parameter, once its
        value has ended, or its ``</function>``."""
        parameter = self._find(self.PARAMETER, self.at)
        end = self._find(self.FUNCTION_END, self.at)
        if end >= 0 and (parameter < 0 or end < parameter):
            self._add("}")
            self.state, self.at = "after_function", end + len(self.FUNCTION_END)
            return True
        key_end = -1 if parameter < 0 else self._find(">", parameter)
        if key_end < 0:
            if last:  # the answer ended in this call
                self._add("}")
                self.done = True
            return False
        ends = [i for i in (self._find(self.PARAMETER_END, key_end),
                            self._find(self.PARAMETER, key_end),
                            self._find(self.FUNCTION_END, key_end)) if i >= 0]
        if not ends and not last:
            return False  # the value goes on
        value_end = min(ends, default=len(self.text))
        key = self.text[parameter + len(self.PARAMETER):key_end]
        value = self.text[key_end + 1:value_end]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        separator = ", " if len(self.arguments) > 1 else ""
        self._add(separator + json.dumps(key, ensure_ascii=False) + ": "
                  + json.dumps(converted(value, self.properties.get(key)), ensure_ascii=False))
        ended = self.text.startswith(self.PARAMETER_END, value_end)
        self.at = value_end + len(self.PARAMETER_END) if ended else value_end
        return True

    def _add(self, text: str) -> None:
        self.arguments.add(text)
        self._entries(self.list.follow(self.arguments, "", self.arguments.span))

    def _after_function(self, last: bool) -> bool:
        start = self._run_end(BLANK, self.at)
        if self.text.startswith(self.CLOSE, start):
            self.state, self.at = "between", start + len(self.CLOSE)
            return True
        if start == len(self.text):
            self.done = last
        elif last or not self.CLOSE.startswith(self.text[start:start + len(self.CLOSE)]):
            self._rest_from(start)
        return False


def converted(value: str, schema: Any) -> Any:
    """A parameter's text as the value its schema's type reads it as
    (vLLM's rules): as it is where the key is not among the tool's
    properties or the type is a string's; null for "null" or "None" (any
    case) where the type allows it or is no string's; an integer or a
    number where the text is one (a whole number an integer), true
    exactly for "true" (any case) under a boolean; an object's or array's
    (or another type's) by ``json.loads`` or else Python's literal syntax;
    the text as it is where the reading fails."""
    if not isinstance(schema, dict):
        return value
    kind, nullable = _type_of(schema)
    if nullable and value.lower() in ("null", "none"):
        return None
    if kind in _STRINGS:
        return value
    if value.lower() in ("null", "none"):
        return None
    if kind.startswith(_INTEGERS):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        if not math.isfinite(number):
            return value
        return int(number) if number == int(number) else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    container = kind in ("object", "array", "arr") or kind.startswith(("dict", "list"))
    if container:
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            pass
        else:
            return _literal(parsed) if isinstance(parsed, str) else parsed
    parsed = _literal(value)
    return _literal(parsed) if container and isinstance(parsed, str) else parsed


def _type_of(schema: dict) -> tuple[str, bool]:
    """A property's type as vLLM reads it (its ``type``, or the first
    non-null type of its ``anyOf``; else "string"), and whether null is
    one of its types."""
    if "type" in schema:
        kind = str(schema["type"]).strip().lower()
        return kind, kind == "null"
    if "anyOf" in schema and isinstance(schema["anyOf"], list):
        kinds = [str(option["type"]).strip().lower() for option in schema["anyOf"]
                 if isinstance(option, dict) and "type" in option]
        others = [kind for kind in kinds if kind != "null"]
        return (others[0] if others else "string"), "null" in kinds
    return "string", False


def _literal(text: Any) -> Any:
    """``text`` read by Python's literal syntax, or as it is if it is none
    (or its value has no JSON form)."""
    try:
        value = ast.literal_eval(text)
        json.dumps(value, allow_nan=False)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return value
