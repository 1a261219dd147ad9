"""``CanonicalJson``: the text ``json.dumps(value, ensure_ascii=False)``
writes for a JSON value, written while the value's own text arrives.

A tool call's ``arguments`` is that text of the arguments the model gave
(as vLLM's parsers make it with ``json.loads`` and ``json.dumps``). To
stream it, the model's text is rewritten as it comes: blank space between
tokens dropped, ``", "`` and ``": "`` as separators, each string's
characters escaped as ``json.dumps`` escapes them (``\\uXXXX`` escapes of
the model decoded first, a surrogate pair joined), each number or literal
as ``json.dumps`` writes the value ``json.loads`` reads from it. So the
text written for a whole value is ``json.dumps(json.loads(text),
ensure_ascii=False)``, but for an object that gives a key twice: it keeps
both members, where ``json.loads`` keeps the last value at the first
key's place.

What is written never changes: text is held back only while it may still
be written differently, i.e. an escape sequence not yet whole (and a high
surrogate's escape, until the next one tells whether they pair), and a
number or literal until the character after it (``1`` may go on as
``1.5``, ``1e2`` is written ``100.0``). The input is read as
``json.loads`` reads it: strictly (no control character inside a string),
``NaN``, ``Infinity`` and ``-Infinity`` taken as numbers.
"""

from __future__ import annotations

import json
import re

from checkpoint.growing_text import GrowingText

_BLANK = " \t\n\r"
_BARE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.")
_BARE_RUN = re.compile(r"[a-zA-Z0-9+.\-]*")  # the characters of _BARE
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
            "t": "\t"}
_HEX = set("0123456789abcdefABCDEF")
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')  # string characters that stand for themselves


def written(text: str) -> str:
    """How ``json.dumps`` writes one decoded piece of a string (no quotes)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class CanonicalJson:
    """The canonical text of the JSON value that starts at ``at`` (blank
    space before it allowed) in a text that grows. ``scan`` reads on from
    where it stopped and adds to ``written``, the canonical text settled so
    far (``out``: it joined); ``end`` is then the index just past the value once it is whole,
    ``error`` the index of the first character that cannot belong to it
    (both None while neither is known). ``last``: the text is whole, so a
    number or literal at its end is settled (or an error).

    Subclasses may watch the members of an outermost object
    (``_member_start`` and ``_member_end``, with the member's key and the
    length of ``written`` at the value's start or end)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.written = GrowingText()
        self.end: int | None = None
        self.error: int | None = None
        self.stack: list[str] = []  # the closing bracket each open container wants
        self.expect = "value"  # what comes next (the keys of _STEPS)
        self.keys: list[str | None] = []  # the key of the member being read, per level
        self.bare_start = 0  # where the number or literal being read starts
        self.string_key: list[str] | None = None  # a key's decoded characters (None: a value)
        self.escape = ""  # an escape sequence so far, from its backslash
        self.high = ""  # a high surrogate's escape, waiting for the next one

    def scan(self, text: str, last: bool = False) -> None:
        while self.end is None and self.error is None and self.at < len(text):
            char = text[self.at]
            if self.expect == "string":
                self._string(text, char)
            elif self.expect == "bare":
                self._bare(text)
            else:
                getattr(self, _STEPS[self.expect])(char)
        if last and self.expect == "bare" and self.end is None and self.error is None:
            self._settle_bare(text)
            if self.end is None and self.error is None and not self.stack:
                self.end = self.at

    def needed_from(self) -> int:
        """Where the text ``scan`` may still read starts: the number or
        literal being read, the escape being read, or ``at``."""
        return (self.bare_start if self.expect == "bare" else self.at) - len(self.escape)

    # -- what comes, by state (each takes the character at ``at``) --------

    def _value(self, char: str) -> None:
        if char in _BLANK:
            self.at += 1
        elif char == "]" and self.expect == "value_or_close":
            self._close(char)
        else:
            self._open_value(char)

    def _open_value(self, char: str) -> None:
        self._started()
        if char == '"':
            self._write('"')
            self.expect, self.string_key = "string", None
        elif char in "{[":
            self._write(char)
            self.stack.append("}" if char == "{" else "]")
            self.keys.append(None)
            self.expect = "key_or_close" if char == "{" else "value_or_close"
        elif char in _BARE:
            self.expect, self.bare_start = "bare", self.at
        else:
            self.error = self.at
            return
        self.at += 1

    def _key(self, char: str) -> None:
        if char in _BLANK:
            self.at += 1
        elif char == "}" and self.expect == "key_or_close":
            self._close(char)
        elif char == '"':
            self._write('"')
            self.expect, self.string_key = "string", []
            self.at += 1
        else:
            self.error = self.at

    def _colon(self, char: str) -> None:
        if char in _BLANK:
            self.at += 1
        elif char == ":":
            self._write(": ")
            self.expect = "value"
            self.at += 1
        else:
            self.error = self.at

    def _after(self, char: str) -> None:
        """After a value inside a container: a comma or its close."""
        if char in _BLANK:
            self.at += 1
        elif char == ",":
            self._write(", ")
            self.expect = "key" if self.stack[-1] == "}" else "value"
            self.at += 1
        elif char == self.stack[-1]:
            self._close(char)
        else:
            self.error = self.at

    def _close(self, char: str) -> None:
        self._write(char)
        self.stack.pop()
        self.keys.pop()
        self.at += 1
        self._ended()

    def _ended(self) -> None:
        """A value has ended (``at`` just past it)."""
        if not self.stack:
            self.end = self.at
            return
        self.expect = "after"
        if len(self.stack) == 1 and self.stack[0] == "}":
            self._member_end(self.keys[0], self.written.size)

    def _started(self) -> None:
        """A value starts at ``at``: a member's, where it is the outermost
        object's."""
        if len(self.stack) == 1 and self.stack[0] == "}":
            self._member_start(self.keys[0], self.written.size)

    # -- numbers and literals ---------------------------------------------

    def _bare(self, text: str) -> None:
        """The number or literal from ``bare_start`` goes on to the first
        character that cannot be one's (then it is settled)."""
        self.at = text.match(_BARE_RUN, self.at).end()
        if self.at < len(text):
            self._settle_bare(text)

    def _settle_bare(self, text: str) -> None:
        try:
            value = json.loads(text[self.bare_start:self.at])
        except ValueError:
            self.error = self.bare_start
            return
        self._write(json.dumps(value))
        self._ended()

    # -- strings ----------------------------------------------------------

    def _string(self, text: str, char: str) -> None:
        if self.escape or self.high:
            self._escaped(text, char)
        elif char == "\\":
            self.escape = char
            self.at += 1
        elif char == '"':
            self._write('"')
            self.at += 1
            if self.string_key is not None:
                self.keys[-1] = "".join(self.string_key)
                self.expect = "colon"
            else:
                self._ended()
        elif char < " ":
            self.error = self.at
        else:  # a run of plain characters at once
            end = text.match(_PLAIN, self.at).end()
            self._decoded(text[self.at:end])
            self.at = end

    def _escaped(self, text: str, char: str) -> None:
        """Inside an escape, or after a high surrogate's: one character."""
        if not self.escape:  # after a high surrogate: is a low one next?
            if char != "\\":
                self._decoded(self._unpaired())
                return
            self.escape = char
            self.at += 1
            return
        if len(self.escape) == 1:
            if char == "u":
                self.escape += char
                self.at += 1
            elif char in _ESCAPES:
                self.escape = ""
                self._flush_high()
                self._decoded(_ESCAPES[char])
                self.at += 1
            else:
                self.error = self.at - 1
            return
        if char not in _HEX:
            self.error = self.at - len(self.escape)
            return
        self.escape += char
        self.at += 1
        if len(self.escape) == 6:
            self._code_point(int(self.escape[2:], 16))

    def _code_point(self, code: int) -> None:
        escape, self.escape = self.escape, ""
        if self.high:
            if 0xDC00 <= code <= 0xDFFF:
                high = int(self.high[2:], 16)
                self.high = ""
                self._decoded(chr(0x10000 + (high - 0xD800) * 0x400 + code - 0xDC00))
                return
            self._decoded(self._unpaired())
        if 0xD800 <= code <= 0xDBFF:
            self.high = escape
        else:
            self._decoded(chr(code))

    def _unpaired(self) -> str:
        """A high surrogate that no low one follows, as json.loads keeps it."""
        code, self.high = int(self.high[2:], 16), ""
        return chr(code)

    def _flush_high(self) -> None:
        if self.high:
            self._decoded(self._unpaired())

    def _decoded(self, chars: str) -> None:
        if self.string_key is not None:
            self.string_key.append(chars)
        self._write(written(chars))

    def _write(self, text: str) -> None:
        self.written.add(text)

    @property
    def out(self) -> str:
        """The canonical text settled so far, joined (for a whole value; a
        stream reads spans of ``written``)."""
        return str(self.written)

    # -- hooks ------------------------------------------------------------

    def _member_start(self, key: str, written_so_far: int) -> None:
        pass

    def _member_end(self, key: str, written_so_far: int) -> None:
        pass


_STEPS = {"value": "_value", "value_or_close": "_value", "key": "_key",
          "key_or_close": "_key", "colon": "_colon", "after": "_after"}
