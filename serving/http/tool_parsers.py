"""Tool-call parsers for tool_choice "auto": readers that find a model's
calls in its free text, under vLLM's parser names
(``--tool-call-parser NAME``).

Every answer reads as ``content before | a run of calls | content after``;
the message's ``content`` is the two content parts joined (None when that
is empty and there are calls), its ``tool_calls`` the run's calls. An
answer without a run is all content, exactly its text. A call's
``arguments`` is the canonical JSON text of the arguments the model gave
(below).

- ``llama3_json`` (Llama 3.x): the run starts the answer (after blank
  space and an optional ``<|python_tag|>``): JSON objects ``{"name": ...,
  "parameters": {...}}`` ("arguments" is read in place of "parameters"),
  separated by ``;``. Nothing comes before the run.
- ``hermes`` (Hermes, Qwen, SmolLM2): the run is ``<tool_call>{"name":
  ..., "arguments": {...}}</tool_call>`` blocks with blank space between;
  the text before the first block is content. The last block may lack its
  closing tag where the answer ends. Some models' tokenizers make the tags
  special tokens, so their text is kept in the output this parser reads
  (``keeps_special_tokens``), as vLLM's hermes parser asks.
- ``pythonic`` (Llama 3.2, Llama 4, ToolACE): the run starts the answer
  (after blank space): a Python list of calls, ``[get_weather(city="Paris"),
  now()]``, each with keyword arguments of literal values, read as
  Python's parser reads them (``python_arguments.py``), a trailing ``,``
  allowed. From the ``[`` on, blank space is Python's: white space and
  comments (``# ...``, up to the line's end), so ``[f(x=1),  # first\n
  g(y=2)]`` is two calls, and a comment after the ``]`` is no content, as
  vLLM's parser, which reads the list with Python's, finds them; a comment
  before the ``[`` makes the answer content, as there. An element ends at
  its ``,`` or the ``]``: one that is no call
  (``f(1)``, ``f(x=y)``, a bracket that does not match) is a malformed
  piece.
- ``mistral`` (Mistral, Mixtral, Ministral, Devstral): the run is
  segments, each the ``[TOOL_CALLS]`` token (its text, kept in the output
  for this parser: ``keeps_special_tokens``) and the calls after it, blank
  space between segments; the text before the first token is content. A
  segment is either a JSON list of ``{"name": ..., "arguments": {...}}``
  objects (the form of Mistral's tokenizers before v11; arguments left out
  read as ``{}``), or one call as a name, an optional ``[ARGS]`` token and
  the arguments' JSON object (v11 on: ``[TOOL_CALLS]get_weather[ARGS]{...}``,
  a token for each call). Which form a segment has is read from its text
  (a ``[`` or a name), so no tokenizer version is needed. Each call's id
  is 9 letters and digits, the only ids Mistral's chat templates accept.
- ``qwen3_coder`` (Qwen3-Coder): XML calls, in ``qwen3_coder.py``.

A JSON call (llama3_json, hermes, mistral's list form) is a
``CallObject`` (``call_object.py``): an object with a string "name" and
the arguments under its key (the first given of each counts, in either
order); mistral's newer form has its arguments' object after the name.
A call's ``arguments`` is the canonical JSON text of its arguments
(``canonical_json.py``: what ``json.dumps`` writes for the value
``json.loads`` reads, vLLM's arguments text). A call is known once its
name is whole and its arguments have begun; then it stays, whatever
follows: an answer cut in it (``max_tokens``) keeps the arguments so far,
as OpenAI's answers do, and arguments whose JSON breaks off end there. In
hermes, what follows a call's object up to ``</tool_call>`` is the
block's; elsewhere the run ends where the JSON broke.

The run ends at the first piece that is not a call (malformed JSON or
Python before the call is known, no "name", no arguments, other text);
from there on the text is content, later call-shaped text included (for
mistral, from the segment's token where the segment has no call yet). So
an answer whose first call is malformed is all content. The syntaxes and
keys are those of vLLM's parsers of the same names; where these rules
differ from them, it is so that a streamed and a whole answer agree:
there, a whole llama3_json answer may have its calls anywhere in its text,
text after the calls is dropped, one malformed hermes block or pythonic
element (or text after a pythonic list) makes the whole answer content, a
call cut short or broken off is content, a mistral call of the v11 form
whose arguments are not JSON is still a call (its arguments the raw
text), and a key given twice counts at its last. Besides, pythonic reads
a signed number (``x=-1``) where vLLM finds none and refuses positional
arguments (vLLM drops them); a keyword given twice is written twice, as
a JSON key given twice is (vLLM keeps its last value, as ``json.loads``
reads the two), and so is a dict key equal to one before it in Python
(``{True: 1, 1: 'x'}``), under the first one's spelling (``{"true": 1,
"true": "x"}``: ``json.loads`` reads vLLM's ``{"true": "x"}``).

A pythonic call is known once its first value has begun (or its ``)``
follows the ``(``: no arguments); from then on it stays likewise, an
element that goes on after its ``)`` (``f(x=1).y``) ending the run there.
Its ``arguments`` is the canonical JSON text of the keyword arguments'
values, what ``json.dumps`` writes for them (``python_arguments.py``).

Streaming: content goes out as soon as it cannot be the start of a call
(a partial ``<tool_call>``, ``<|python_tag|>`` or ``[TOOL_CALLS]`` is held
back, and a pythonic answer from its ``[`` on). A call's first entry
(index, id, type, name, arguments "") goes out when the call is known,
then its arguments as they settle, in pieces, held back only while they
may still be written otherwise: an escape not yet whole, a number or word
until the character after it, a pythonic keyword, comma (maybe a trailing
one) or closing quote (maybe joined by another string) until what
follows; never the call object's own ``}`` or a tag. The deltas joined are
the message; ``pieces`` gives the same in the answer's order (content
before a call apart from content after it). Only text not yet settled is
scanned: the readers keep a cursor and a state, never parsing the whole
answer again, and a search that waits for more text (a tag, the end of a
run of blank space or of a name) goes on from where it stopped, so each
reader's work is linear in the answer's length (``auto_calls.py``).
"""

from __future__ import annotations

import re
import secrets
import string
from typing import ClassVar

from serving.http.auto_calls import BLANK as _BLANK
from serving.http.auto_calls import AutoCallsReader
from serving.http.call_object import CallObject
from serving.http.canonical_json import CanonicalJson
from serving.http.python_arguments import PythonArguments
from serving.http.qwen3_coder import Qwen3CoderReader

_MISTRAL_NAME = re.compile(r"[^\s\[\]{}]*")  # up to blank space, [ARGS] or {
_ALPHANUMERIC = string.ascii_letters + string.digits
_NAME_START = re.compile(r"[^\W\d]")  # a Python name's first character
_WORD = re.compile(r"\w*")  # the rest of the name
_LINE_END = re.compile(r"[\r\n]")  # a comment's end: "\r" ends a line for Python too


class Llama3JsonReader(AutoCallsReader):
    """``llama3_json``. States: "lead" (nothing settled yet: blank space
    or a partial tag may still lead to a call), "tagged" (after the tag,
    which ends at ``at``: blank space may still lead to a call), "object"
    (inside a call's object ``call``, from ``object_start``), "between"
    (after a call, at ``at``: blank space and one ``;`` may lead to the
    next), "separated" (after that ``;``, at ``at``: blank space and the
    next call's ``{``)."""

    TAG = "<|python_tag|>"

    def __init__(self, tools: dict[str, dict] | None = None) -> None:
        super().__init__(tools)
        self.state = "lead"
        self.at = 0
        self.object_start = 0
        self.call: CallObject | None = None

    STEPS: ClassVar[dict[str, str]] = {"lead": "_lead", "tagged": "_tagged", "object": "_object",
                                       "between": "_between", "separated": "_separated"}

    def _needed_from(self) -> int:
        if self.state in ("lead", "tagged"):
            return 0  # all of it is content if no call starts it
        if self.state == "object":
            if self.call.started:
                return self.call.needed_from()
            return self.object_start if self.list else 0
        return self.at

    def _open_object(self, at: int) -> bool:
        self.state, self.object_start = "object", at
        self.call = CallObject(at, ("arguments", "parameters"))
        return True

    def _lead(self, last: bool) -> bool:
        """Whether the answer starts with a call decides everything: it
        waits while the text so far is blank or a partial tag."""
        start = self._run_end(_BLANK, 0)
        if self.text.startswith(self.TAG, start):
            self.state, self.at = "tagged", start + len(self.TAG)
            return True
        if not last and self.TAG.startswith(self.text[start:start + len(self.TAG)]):
            return False
        return self._first_object(start)

    def _tagged(self, last: bool) -> bool:
        start = self._run_end(_BLANK, self.at)
        if start == len(self.text) and not last:
            return False
        return self._first_object(start)

    def _first_object(self, start: int) -> bool:
        if self.text.startswith("{", start):
            return self._open_object(start)
        self._rest_from(0)
        return False

    def _object(self, last: bool) -> bool:
        read = self._read(self.call, last)
        if read == "no call":
            self._rest_from(self.object_start if self.list else 0)
        elif read == "broken":
            self._rest_from(self.call.error)
        elif read == "cut":
            self.done = True
        elif read == "end":
            self.state, self.at = "between", self.call.end
            return True
        return False

    def _between(self, last: bool) -> bool:
        start = self._run_end(_BLANK, self.at)
        if self.text.startswith(";", start):
            self.state, self.at = "separated", start + 1
            return True
        return self._after_run(start, last)

    def _separated(self, last: bool) -> bool:
        start = self._run_end(_BLANK, self.at)
        if self.text.startswith("{", start):
            return self._open_object(start)
        return self._after_run(start, last)

    def _after_run(self, start: int, last: bool) -> bool:
        """The run is over at ``start``: what follows is content."""
        if start == len(self.text):
            self.done = last  # only blank space and a ';' after the run: no content
        else:
            self._rest_from(start)
        return False


class HermesReader(AutoCallsReader):
    """``hermes``. States: "before" (content, up to the first
    ``<tool_call>``), "block" (inside a block whose tag is at
    ``block_start``: its call object ``call``), "close" (from ``at``, the
    rest of a block whose call is known, up to its ``</tool_call>``),
    "between" (after a block, at ``at``)."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    keeps_special_tokens = True

    def __init__(self, tools: dict[str, dict] | None = None) -> None:
        super().__init__(tools)
        self.state = "before"
        self.at = 0
        self.block_start = 0
        self.call: CallObject | None = None

    STEPS: ClassVar[dict[str, str]] = {"before": "_before", "block": "_block", "close": "_close",
                                       "between": "_between"}

    def _needed_from(self) -> int:
        if self.state == "block":
            return self.call.needed_from() if self.call.started else self.block_start
        return self.at

    def _open_block(self, tag: int | None) -> bool:
        if tag is None:
            return False
        self.state, self.block_start = "block", tag
        self.call = CallObject(tag + len(self.OPEN), ("arguments",))
        return True

    def _before(self, last: bool) -> bool:
        return self._open_block(self._say_until(self.OPEN, last))

    def _block(self, last: bool) -> bool:
        read = self._read(self.call, last)
        if read == "no call":
            self._rest_from(self.block_start)
        elif read == "cut":
            self.done = True
        elif read in ("end", "broken"):
            self.state = "close"
            self.at = self.call.end if read == "end" else self.call.error
            return True
        return False

    def _close(self, last: bool) -> bool:
        """What follows a call's object in its block (blank space, or what
        the model wrote by mistake) is the block's, up to the tag."""
        close = self._find(self.CLOSE, self.at)
        if close < 0:
            self.done = last  # the answer ended in this block
            return False
        self.state, self.at = "between", close + len(self.CLOSE)
        return True

    def _between(self, last: bool) -> bool:
        return self._open_block(self._next_tag(self.OPEN, last))


class PythonicReader(AutoCallsReader):
    """``pythonic``. States: "lead" (blank space so far), "element" (at
    ``at``, after the ``[`` or a ``,``: the next element's start, a call's
    name and ``(``), "call" (inside the argument list of the call named
    ``name`` at ``element_start``, read by ``arguments``), "after_call" (after that
    list's ``)``, at ``at``: the element ends at a ``,`` or the ``]``),
    "after" (after the ``]``). A call is known (its first entry sent) once
    ``arguments`` is (``PythonArguments.known``); then its arguments go
    out as they settle."""

    def __init__(self, tools: dict[str, dict] | None = None) -> None:
        super().__init__(tools)
        self.state = "lead"
        self.at = 0
        self.element_start = 0
        self.name = ""
        self.arguments: PythonArguments | None = None

    STEPS: ClassVar[dict[str, str]] = {"lead": "_lead", "element": "_element", "call": "_inside",
                                       "after_call": "_after_call", "after": "_after"}

    def _needed_from(self) -> int:
        if self.state == "lead" or not self.list:
            return 0  # all of it is content if no call comes
        if self.state == "call":
            return self.arguments.needed_from() if self.arguments.known else self.element_start
        return self.at

    def _fail(self, at: int) -> None:
        """The element at ``at`` is no call: content from there, or the
        whole answer where no call came before it."""
        self._rest_from(at if self.list else 0)

    def _lead(self, last: bool) -> bool:
        start = self._run_end(_BLANK, 0)
        if start == len(self.text) and not last:
            return False
        if self.text.startswith("[", start):
            self.state, self.at = "element", start + 1
            return True
        self._rest_from(0)
        return False

    def _element(self, last: bool) -> bool:
        """Blank space, a Python name, blank space and its ``(``; where the
        element has no such head, it may be the list's ``]``."""
        start = self._python_blank_end(self.at)
        if _NAME_START.match(self.text[start:start + 1]):  # one character: never the text after it
            name_end = self._run_end(_WORD, start + 1)
            if name_end == len(self.text) and not last:
                return False  # a name so far
            paren = self._python_blank_end(name_end)
            if self.text.startswith("(", paren):
                self.element_start, self.name = start, self.text[start:name_end]
                self.state, self.arguments = "call", PythonArguments(paren + 1)
                return True
            if paren == len(self.text) and not last:
                return False  # a name and blank space so far
        elif start == len(self.text) and not last:
            return False  # blank space so far
        if self.list and self.text.startswith("]", start):  # after a trailing ","
            self.state, self.at = "after", start + 1
            return True
        self._fail(start)
        return False

    def _inside(self, last: bool) -> bool:
        arguments = self.arguments
        arguments.scan(self.text, last)
        if not arguments.known:
            if arguments.error is not None or last:
                self._fail(self.element_start)
            return False
        self._entries(self.list.follow(arguments, self.name, arguments.written.span))
        if arguments.end is not None:
            self.state, self.at = "after_call", arguments.end
            return True
        if arguments.error is not None:
            self._rest_from(arguments.error)
        elif last:
            self.done = True  # cut in the call: it stays as far as it came
        return False

    def _after_call(self, last: bool) -> bool:
        start = self._python_blank_end(self.at)
        if start == len(self.text):
            self.done = last  # the answer ends in the list, after this call
            return False
        if self.text[start] not in ",]":
            self._rest_from(start)
            return False
        self.state = "element" if self.text[start] == "," else "after"
        self.at = start + 1
        return True

    def _after(self, last: bool) -> bool:
        start = self._python_blank_end(self.at)
        if start == len(self.text):
            self.done = last  # only blank space after the list: no content
        else:
            self._rest_from(start)
        return False

    def _python_blank_end(self, start: int) -> int:
        """Where blank space from ``start`` ends as Python's parser reads
        it, white space and comments (a comment runs up to its line's end,
        a "\r" or "\n"):
        the text's end while a comment is still open there. Goes on from
        where the last look from ``start`` stopped (in ``searched``: where
        the blank space read so far ends, and how far an open comment there
        has been searched for its line's end), so each character is looked
        at a bounded number of times."""
        ended, searched = ("python blank", start), ("python comment", start)
        at = self.searched.get(ended, start)
        while True:
            at = self.text.match(_BLANK, at).end()
            if not self.text.startswith("#", at):
                break
            line_end = self.text.search(_LINE_END, max(at, self.searched.get(searched, at)))
            if line_end is None:
                self.searched[ended], self.searched[searched] = at, len(self.text)
                return len(self.text)
            at = line_end.start()
        self.searched[ended] = at
        return at


class MistralReader(AutoCallsReader):
    """``mistral``. States: "before" (content, up to the first token),
    "segment" (after the token at ``segment_start``, at ``at``: a list or
    a name comes), "arguments" (the object ``arguments`` of the call whose
    name came), "element" (at ``at``, after the list's ``[`` or a ``,``:
    the next element's ``{``), "object" (inside that element, the call
    object ``call`` from ``object_start``), "after_element" (at ``at``: a
    ``,`` or the ``]``), "between" (after a segment, at ``at``).
    ``segment_calls``: how many calls came before the current segment."""

    TOKEN, ARGS = "[TOOL_CALLS]", "[ARGS]"
    keeps_special_tokens = True

    def __init__(self, tools: dict[str, dict] | None = None) -> None:
        super().__init__(tools)
        self.state = "before"
        self.at = 0
        self.segment_start = 0
        self.segment_calls = 0
        self.object_start = 0
        self.call: CallObject | None = None
        self.name = ""
        self.arguments: CanonicalJson | None = None

    def _new_id(self) -> str:
        return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))

    STEPS: ClassVar[dict[str, str]] = {
        "before": "_before", "segment": "_segment", "arguments": "_arguments",
        "element": "_element", "object": "_object", "after_element": "_after_element",
        "between": "_between"}

    def _needed_from(self) -> int:
        segment_open = len(self.list) == self.segment_calls  # no call of it yet
        if self.state == "segment" or (self.state == "element" and segment_open):
            return self.segment_start
        if self.state == "arguments":
            return self.arguments.needed_from()
        if self.state == "object":
            if self.call.started:
                return self.call.needed_from()
            return self.segment_start if segment_open else self.object_start
        return self.at

    def _fail(self, at: int) -> None:
        """The piece at ``at`` is no call: content from there, or from the
        segment's token where no call of the segment came before it."""
        self._rest_from(at if len(self.list) > self.segment_calls else self.segment_start)

    def _open_segment(self, tag: int | None) -> bool:
        if tag is None:
            return False
        self.state, self.segment_start, self.at = "segment", tag, tag + len(self.TOKEN)
        self.segment_calls = len(self.list)
        return True

    def _before(self, last: bool) -> bool:
        return self._open_segment(self._say_until(self.TOKEN, last))

    def _between(self, last: bool) -> bool:
        return self._open_segment(self._next_tag(self.TOKEN, last))

    def _segment(self, last: bool) -> bool:
        """The older form's ``[`` or the newer form's name, an optional
        ``[ARGS]`` and the arguments' ``{``, blank space allowed between;
        the call is known at the ``{``."""
        start = self._run_end(_BLANK, self.at)
        if start == len(self.text) and not last:
            return False
        if self.text.startswith("[", start):
            self.state, self.at = "element", start + 1
            return True
        name_end = self._run_end(_MISTRAL_NAME, start)
        if name_end == start:
            self._fail(start)
            return False
        if name_end == len(self.text) and not last:
            return False  # the name so far
        at = self._run_end(_BLANK, name_end)
        if self.text.startswith(self.ARGS, at):
            at = self._run_end(_BLANK, at + len(self.ARGS))
        elif not last and self.ARGS.startswith(self.text[at:at + len(self.ARGS)]):
            return False  # blank space or a partial [ARGS] after the name
        if at == len(self.text) and not last:
            return False
        if not self.text.startswith("{", at):
            self._fail(start)
            return False
        self.name, self.arguments = self.text[start:name_end], CanonicalJson(at)
        self.state = "arguments"
        return True

    def _arguments(self, last: bool) -> bool:
        self.arguments.scan(self.text, last)
        self._entries(self.list.follow(self.arguments, self.name, self.arguments.written.span))
        if self.arguments.end is not None:
            self.state, self.at = "between", self.arguments.end
            return True
        if self.arguments.error is not None:
            self._rest_from(self.arguments.error)
        return False

    def _element(self, last: bool) -> bool:
        start = self._run_end(_BLANK, self.at)
        if start == len(self.text):
            if last:  # the answer ends in the list: the calls before stay
                self._fail(start)
            return False
        if self.text[start] == "{":
            self.state, self.object_start = "object", start
            self.call = CallObject(start, ("arguments",), default="{}")
            return True
        self._fail(start)
        return False

    def _object(self, last: bool) -> bool:
        read = self._read(self.call, last)
        if read == "no call":
            self._fail(self.object_start)
        elif read == "broken":
            self._rest_from(self.call.error)
        elif read == "cut":
            self.done = True
        elif read == "end":
            self.state, self.at = "after_element", self.call.end
            return True
        return False

    def _after_element(self, last: bool) -> bool:
        start = self._run_end(_BLANK, self.at)
        if start == len(self.text):
            self.done = last  # the answer ends in the list, after a call
            return False
        if self.text[start] in ",]":
            self.state = "element" if self.text[start] == "," else "between"
            self.at = start + 1
            return True
        self._rest_from(start)
        return False


TOOL_CALL_PARSERS: dict[str, type[AutoCallsReader]] = {
    "llama3_json": Llama3JsonReader,
    "hermes": HermesReader,
    "pythonic": PythonicReader,
    "mistral": MistralReader,
    "qwen3_coder": Qwen3CoderReader,
}
