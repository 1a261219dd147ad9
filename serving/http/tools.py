"""Tool calling on /v1/chat/completions, as vLLM's OpenAI server serves it.

A request's ``tools`` are always given to the chat template. Its
``tool_choice`` says what the answer is:

- "none" (the default without tools): a plain answer.
- ``{"type": "function", "function": {"name": X}}``: one call of X. The
  output is held to X's ``parameters`` schema (the engine's structured
  outputs) and the generated JSON text is the call's ``arguments``.
- "required": one or more calls. The output is held to a JSON array of
  ``{"name": <a tool's name>, "parameters": <that tool's arguments>}``
  objects without other keys (at most one with ``parallel_tool_calls``
  false); each element is one call, its ``arguments`` the canonical JSON
  text of the element's parameters (``canonical_json.py``).
- "auto" (the default with tools): the model answers freely and a
  tool-call parser made for its call syntax (``tool_parsers.py``, chosen
  with ``--enable-auto-tool-choice --tool-call-parser NAME``) finds the
  calls in its text; what is not a call is the content. The request's own
  structured-output fields, if any, hold as they would without tools.
  Without a parser "auto" is refused. With ``parallel_tool_calls`` false
  only the first call the parser finds is answered (``FirstCallOnly``,
  as vLLM filters them).

A forced call's message has content "" and the calls in ``tool_calls``,
each with its own ``chatcmpl-tool-<hex>`` id; with "required" or "auto",
an answer the engine ended with "stop" that has calls ends with
"tool_calls" (a named call keeps "stop"). OpenAI's deprecated
``functions`` and ``function_call`` are refused, "none" excepted. A bad
tool or choice is a ``FieldError`` naming the field; a named or required
tool choice given with a structured-output field is refused: one
constraint per request.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from engine.structured_outputs.params import StructuredOutputsParams
from ipc.errors import InvalidRequestError
from serving.http.call_object import CallObject
from serving.http.protocol import ChatCompletionRequest, FieldError
from serving.http.streamed_text import StreamedText
from serving.http.structured import constraint_fields

NO_ARGUMENTS = {"type": "object", "properties": {}}
_NAMED_USAGE = '{"type": "function", "function": {"name": ...}}'


def new_tool_call_id() -> str:
    return f"chatcmpl-tool-{secrets.token_hex(16)}"


def rendered_tools(request) -> list[dict] | None:
    """The request's tools as the client sent them, for the chat template."""
    if request.tools is None:
        return None
    return [tool.model_dump(exclude_unset=True) for tool in request.tools]


@dataclass(frozen=True)
class ToolChoice:
    """A request's checked tool choice. ``mode`` "none": a plain answer;
    "named": one call of ``name``; "required": one or more calls; "auto":
    calls, content or both, as ``parser`` (a reader class) finds them in
    free text, of which ``first_call_only`` (``parallel_tool_calls``
    false) answers the first call alone, and which is given the request's
    ``tools`` (each tool's parameters schema by its name: a parser may read
    values by them). ``schema`` is the JSON schema the output is held to
    (None for "none" and "auto"). A named or "required" choice keeps the
    server's ``parser`` too (None without one), only for the special
    tokens it shows (``skip_special_tokens``)."""

    mode: Literal["none", "named", "required", "auto"]
    name: str | None = None
    schema: dict | None = None
    parser: type[ToolCallReader] | None = None
    first_call_only: bool = False
    tools: dict[str, dict] | None = field(default=None, compare=False)

    def constraint(self) -> StructuredOutputsParams | None:
        """The engine's constraint for the output, or None."""
        return None if self.schema is None else StructuredOutputsParams(json=self.schema)

    def skip_special_tokens(self, asked: bool) -> bool:
        """Whether the output's text leaves special tokens out: as the
        request ``asked``, but shown under any choice but "none" when the
        server's parser reads them (vLLM's parsers adjust every request
        with tools whose choice is not "none", named and "required" too)."""
        keeps = self.parser is not None and self.parser.keeps_special_tokens
        return asked and not (self.mode != "none" and keeps)

    def reader(self) -> ToolCallReader | None:
        """A fresh reader of one choice's text, or None for a plain answer."""
        if self.mode == "named":
            return NamedCallReader(self.name)
        if self.mode == "required":
            return RequiredCallsReader()
        if self.mode == "auto":
            reader = self.parser(self.tools)
            return FirstCallOnly(reader) if self.first_call_only else reader
        return None


MODES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolSpelling:
    """How an API writes a tool and a named tool choice, for its errors:
    the path of a tool's function name (``{i}``: the tool's index), the
    path of a named choice's name, and the named choice's form."""

    function_name: str
    named_name: str
    named_usage: str


CHAT_SPELLING = ToolSpelling("tools.{i}.function.name", "tool_choice.function.name",
                             _NAMED_USAGE)


def tool_choice_of(request: ChatCompletionRequest,
                   parser: type[ToolCallReader] | None = None) -> ToolChoice:
    """The request's ``ToolChoice``; ``FieldError`` (or ``InvalidRequestError``) for a
    choice this server does not serve or that its tools do not allow.
    ``parser`` makes the reader of an "auto" answer (None: "auto" refused)."""
    _refuse_functions(request)
    choice = request.tool_choice
    if choice is None or choice in MODES:
        return resolve_tool_choice(request, choice, None, parser, CHAT_SPELLING, shown_choice(choice))
    return resolve_tool_choice(request, "named", _named_function(choice), parser,
                               CHAT_SPELLING, shown_choice(choice))


def resolve_tool_choice(request: ChatCompletionRequest, mode: str | None, name: str | None,
                        parser: type[ToolCallReader] | None, spelling: ToolSpelling,
                        shown: str) -> ToolChoice:
    """The ``ToolChoice`` of a choice already read, in whichever API's
    spelling (``spelling``, ``shown``: for errors): ``mode`` one of
    ``MODES``, "named" (calling ``name``) or None (the default: "auto" with
    tools, else "none"); ``request``: the chat request whose tools,
    ``parallel_tool_calls`` and structured-output fields it goes with."""
    schemas = _tool_schemas(request, spelling)
    if mode is None:
        mode = "auto" if schemas else "none"
    if mode == "none":
        return ToolChoice("none")
    if schemas is None:
        raise FieldError("tool_choice", f"tool_choice {shown} needs tools")
    if mode == "auto":
        if parser is None:
            raise FieldError("tool_choice",
                             'tool_choice "auto" (the default when tools are given) needs a '
                             "tool-call parser to find calls in the model's free text, and "
                             "this server was started without one (--enable-auto-tool-choice "
                             '--tool-call-parser NAME): send tool_choice "none", "required" '
                             f"or {spelling.named_usage}")
        return ToolChoice("auto", parser=parser,
                          first_call_only=request.parallel_tool_calls is False, tools=schemas)
    _refuse_second_constraint(request)
    if mode == "required":
        return ToolChoice("required", schema=_calls_schema(schemas, request.parallel_tool_calls),
                          parser=parser)
    if name not in schemas:
        raise FieldError(spelling.named_name,
                         f"tool_choice names the function {name!r}, which is not among tools "
                         f"({', '.join(schemas)})")
    return ToolChoice("named", name, schemas[name], parser=parser)


def _refuse_functions(request: ChatCompletionRequest) -> None:
    if request.functions is not None:
        raise FieldError("functions", "functions is OpenAI's deprecated form of tools, not "
                                      "served here: send tools (and tool_choice) instead")
    if request.function_call not in (None, "none"):
        raise FieldError("function_call", "function_call is OpenAI's deprecated form of "
                                          "tool_choice, not served here: send tool_choice")


def _tool_schemas(request: ChatCompletionRequest,
                  spelling: ToolSpelling) -> dict[str, dict] | None:
    """Each tool's arguments schema by its name (None without tools)."""
    if request.tools is None:
        return None
    if not request.tools:
        raise FieldError("tools", "tools must not be empty: give one tool or more, or leave "
                                  "tools out")
    schemas: dict[str, dict] = {}
    for i, tool in enumerate(request.tools):
        name = tool.function.name
        if not name:
            raise FieldError(spelling.function_name.format(i=i),
                             "a tool's function name must not be empty")
        if name in schemas:
            raise FieldError(spelling.function_name.format(i=i),
                             f"two tools are named {name!r}: a call's name must tell them apart")
        schemas[name] = NO_ARGUMENTS if tool.function.parameters is None else \
            tool.function.parameters
    return schemas


def _named_function(choice: Any) -> str:
    if isinstance(choice, str):
        raise FieldError("tool_choice", f"tool_choice must be \"none\", \"auto\", \"required\" "
                                        f"or {_NAMED_USAGE}, got {choice!r}")
    if choice.get("type", "function") != "function":
        raise FieldError("tool_choice.type", f"tool_choice type must be \"function\", got "
                                             f"{choice.get('type')!r}")
    function = choice.get("function")
    if not isinstance(function, dict):
        raise FieldError("tool_choice.function", f"a named tool_choice is {_NAMED_USAGE}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise FieldError("tool_choice.function.name", "a named tool_choice needs the function's "
                                                      f"name: {_NAMED_USAGE}")
    return name


def _refuse_second_constraint(request: ChatCompletionRequest) -> None:
    given = constraint_fields(request)
    if given:
        raise InvalidRequestError(f"a named or required tool_choice holds the output to its "
                                  f"tools' schemas: give it without {given[0]} (one "
                                  "constraint per request)")


def _calls_schema(schemas: dict[str, dict], parallel: bool | None) -> dict:
    """The array of calls "required" asks for: each element one tool's name
    and its arguments, and nothing else (a key beside them would be text no
    call carries). Each tool's parameters sit inside the array, so their
    local references (``#/$defs/...``, ``#/definitions/...``, ``#``) are
    moved to point where they now are (``moved_refs``); each tool keeps its
    own definitions, whatever names other tools give theirs."""
    items = []
    for i, (name, params) in enumerate(schemas.items()):
        params = moved_refs(params, f"#/items/anyOf/{i}/properties/parameters")
        items.append({"properties": {"name": {"type": "string", "enum": [name]},
                                     "parameters": params},
                      "required": ["name", "parameters"], "additionalProperties": False})
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": items}}
    if parallel is False:
        schema["maxItems"] = 1
    return schema


# Keywords whose value is data, not a schema: a "$ref" key in them is data too.
_DATA_KEYWORDS = ("enum", "const", "default", "examples")
# Keywords whose value maps names (which may be any word) to schemas.
_NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
              "dependencies")


def moved_refs(schema: Any, base: str) -> Any:
    """A copy of ``schema`` for a place ``base`` (a JSON pointer fragment,
    ``#/...``) inside a larger document: each local ``$ref`` (``#`` or a
    ``#/...`` pointer, relative to ``schema``'s root) gets ``base`` in
    front, so it still names the same subschema; data is left as it is,
    and so is a subschema with an ``$id``: a resource of its own, which its
    local references are relative to wherever it sits."""
    if isinstance(schema, list):
        return [moved_refs(s, base) for s in schema]
    if not isinstance(schema, dict) or "$id" in schema:
        return schema
    out = {}
    for word, value in schema.items():
        if word == "$ref" and isinstance(value, str) and value.split("/")[0] == "#":
            out[word] = base + value[1:]
        elif word in _DATA_KEYWORDS:
            out[word] = value
        elif word in _NAME_MAPS and isinstance(value, dict):
            out[word] = {name: moved_refs(s, base) for name, s in value.items()}
        else:
            out[word] = moved_refs(value, base)
    return out


def shown_choice(choice: Any) -> str:
    """A tool choice as an error quotes it."""
    return json.dumps(choice) if not isinstance(choice, str) else f'"{choice}"'


class ToolCallReader:
    """One choice's output text turned into tool calls (and content). The
    route uses ``pieces`` or ``delta`` (each new piece of text, ``last`` on
    the final one) and ``message`` (the whole answer's ``content`` and
    ``tool_calls``). ``pieces`` are what a piece of text lets out, in the
    order of the answer: ("content", text) and ("call", entry), an entry
    being a stream's ``delta.tool_calls`` entry; ``delta`` is them as the
    chat's stream delta. A reader whose whole text is calls implements
    ``add`` (the entries of a piece) and ``calls`` (the message's
    ``tool_calls``), and its content is "". Every call keeps one id, in
    the stream and in the message: a call's first entry (``CallList``: the
    one with its id, type and name, arguments "") starts it and later
    entries add to its arguments as they settle, so a call is whole only
    when the next item or the answer's end comes; the arguments joined are
    the message's.

    ``keeps_special_tokens``: the reader finds calls by text that may be a
    special token's (Mistral's ``[TOOL_CALLS]``, hermes' ``<tool_call>``), so the output it reads must show
    special tokens whatever the request's ``skip_special_tokens`` says, as
    vLLM's parser of it asks (``ToolChoice.skip_special_tokens``)."""

    keeps_special_tokens: ClassVar[bool] = False

    def add(self, text: str, last: bool = False) -> list[dict]:
        raise NotImplementedError

    def calls(self) -> list[dict]:
        raise NotImplementedError

    def pieces(self, text: str, last: bool = False) -> list[tuple[str, Any]]:
        return [("call", entry) for entry in self.add(text, last)]

    def delta(self, text: str, last: bool = False) -> dict:
        return delta_of(self.pieces(text, last))

    def message(self) -> dict:
        calls = self.calls()
        return {"content": "", **({"tool_calls": calls} if calls else {})}

    def finish_reason(self, reason: str | None) -> str | None:
        return reason


class FirstCallOnly(ToolCallReader):
    """``parallel_tool_calls`` false under "auto": ``calls``' answer with
    its first call alone (its stream's entries of index 0), the content
    as it is."""

    def __init__(self, calls: ToolCallReader) -> None:
        self.calls_reader = calls

    def pieces(self, text: str, last: bool = False) -> list[tuple[str, Any]]:
        return [(kind, value) for kind, value in self.calls_reader.pieces(text, last)
                if kind != "call" or value["index"] == 0]

    def message(self) -> dict:
        message = self.calls_reader.message()
        if message.get("tool_calls"):
            message["tool_calls"] = message["tool_calls"][:1]
        return message

    def finish_reason(self, reason: str | None) -> str | None:
        return self.calls_reader.finish_reason(reason)


def delta_of(pieces: list[tuple[str, Any]]) -> dict:
    """A chat stream's delta for ``pieces``: their content joined, their
    call entries in order (no key for what they hold none of), an entry
    that adds arguments to the entry before it (same call) joined to it."""
    content = "".join(value for kind, value in pieces if kind == "content")
    entries: list[dict] = []
    for kind, value in pieces:
        if kind != "call":
            continue
        if entries and entries[-1]["index"] == value["index"] and "id" not in value:
            before = entries[-1]
            arguments = before["function"].get("arguments", "") + value["function"]["arguments"]
            entries[-1] = {**before, "function": {**before["function"], "arguments": arguments}}
        else:
            entries.append(value)
    delta: dict[str, Any] = {}
    if content:
        delta["content"] = content
    if entries:
        delta["tool_calls"] = entries
    return delta


class CallList:
    """An answer's calls as a stream sends them: ``open`` starts a call
    (its first entry: index, id, type, name and arguments ""), ``extend``
    sends what the open call's arguments have grown by; ``found`` holds the
    message's calls, each with all the arguments sent for it, so the stream
    and the message agree. ``follow`` does both for a call read from a
    source (a ``CallObject``, a ``PythonArguments``) as it grows.

    The open call's arguments are kept as the pieces sent (``sent``: their
    length), joined only where ``found`` is asked for: a stream's work for
    a call is its arguments' length, not the square of it."""

    def __init__(self, new_id: Callable[[], str] = None) -> None:
        self.new_id = new_id or new_tool_call_id
        self.calls: list[dict] = []
        self.followed: object = None  # what the open call is read from
        self.sent = 0  # the length of the open call's arguments sent
        self.unjoined: list[str] = []  # the open call's pieces not yet in ``calls``

    def __len__(self) -> int:
        return len(self.calls)

    @property
    def found(self) -> list[dict]:
        """The message's calls so far, the open one's arguments joined."""
        self._join()
        return self.calls

    def _join(self) -> None:
        if self.unjoined:
            function = self.calls[-1]["function"]
            function["arguments"] += "".join(self.unjoined)
            self.unjoined = []

    def open(self, name: str) -> dict:
        self._join()  # the call before is whole
        call = tool_call(name, "", self.new_id())
        self.calls.append(call)
        self.sent = 0
        return {"index": len(self.calls) - 1, **tool_call(name, "", call["id"])}

    def extend(self, added: str) -> list[dict]:
        """The entry for ``added``, what the open call's arguments grew by
        (none where it is empty)."""
        if not added:
            return []
        self.unjoined.append(added)
        self.sent += len(added)
        return [{"index": len(self.calls) - 1, "function": {"arguments": added}}]

    def follow(self, source: object, name: str,
               arguments_from: Callable[[int], str]) -> list[dict]:
        """The entries for the call of ``name`` read from ``source``, whose
        arguments settled so far, from a given character on, are
        ``arguments_from`` of it: its first entry where ``source`` is new,
        then what its arguments grew by since the last entry."""
        entries = []
        if self.followed is not source:
            self.followed = source
            entries.append(self.open(name))
        return entries + self.extend(arguments_from(self.sent))


class NamedCallReader(ToolCallReader):
    """A named tool choice: the whole text is the call's arguments, as it
    is (vLLM's). An empty or blank text (white space alone) makes no call,
    so blank text is held back: the call's first entry, with its id, type
    and name, comes with the first other character, which, with all the
    text before it, is its first piece of arguments; then each piece of
    text is one. A stream, the chat's whole message and a Responses answer
    (``responses_items.OutputItems``) then agree: blank text to the end is
    no call in any of them."""

    def __init__(self, name: str) -> None:
        self.name = name
        # The blank text before the call, as its pieces, kept until it
        # starts and joined once then: a long run of blank pieces costs its
        # length, not the square of it.
        self.blank: list[str] = []
        self.list = CallList()

    def add(self, text: str, last: bool = False) -> list[dict]:
        if self.list:
            return self.list.extend(text)
        self.blank.append(text)
        if not text.strip():  # the text before it was blank too: no call yet
            return []
        return [self.list.open(self.name), *self.list.extend("".join(self.blank))]

    def calls(self) -> list[dict]:
        return list(self.list.found)


class RequiredCallsReader(ToolCallReader):
    """A "required" tool choice: the text is a JSON array of {"name",
    "parameters"} objects, each element one call (``CallObject``), its
    arguments streamed as they settle: the first entry once its name is
    whole and its parameters have begun, then their canonical text in
    pieces. An element the answer is cut in (``max_tokens``) keeps the
    arguments it has so far, in the stream and in the message alike, as
    OpenAI's answers cut in a call do.

    The output is held to the array's schema, so outside the elements there
    are only brackets, commas and blank space: the next ``{`` after an
    element starts the next one. Text that is no element (which the
    schema leaves no room for) ends the calls."""

    def __init__(self) -> None:
        self.text = StreamedText()
        self.at = 0  # where the search for the next element goes on
        self.element: CallObject | None = None
        self.list = CallList()
        self.over = False

    def add(self, text: str, last: bool = False) -> list[dict]:
        self.text.add(text)
        entries: list[dict] = []
        while not self.over:
            if self.element is None:
                start = self.text.find("{", self.at)
                if start < 0:
                    self.at = len(self.text)
                    break
                self.element = CallObject(start, ("parameters",))
            self.element.scan(self.text, last)
            if self.element.started:
                entries += self.list.follow(self.element, self.element.name,
                                            self.element.arguments_from)
            if self.element.end is None or self.element.failed:
                self.over = self.element.error is not None or self.element.failed
                break
            self.at, self.element = self.element.end, None
        self.text.release(self.at if self.element is None else self.element.needed_from())
        return entries

    def calls(self) -> list[dict]:
        return list(self.list.found)

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.list.found else reason


def tool_call(name: str, arguments: str, call_id: str) -> dict:
    """A message's tool call; ``arguments``: the JSON text of its arguments."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
