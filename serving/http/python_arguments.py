"""``PythonArguments``: the keyword arguments of a Python call,
``name(key=value, ...)``, read while the call's text arrives and written
as the canonical JSON text of the object they make (what ``json.dumps``
writes for it; a keyword given twice: below), so that a pythonic tool
call's arguments can be streamed.

A value is a literal, as Python's parser reads it: a string (quoted with
``'`` or ``"``, single or triple, an ``r`` or ``u`` prefix allowed,
adjacent strings joined, escapes decoded as Python decodes them), a number
(Python's spellings: ``1_000``, ``0x1F``, ``1e3``, ``.5``; a sign in front
allowed), ``True``, ``False``, ``None``, and lists and dicts of literals,
a dict's keys being strings, numbers, ``True``, ``False`` or ``None``
(written as ``json.dumps`` writes such keys: ``"1"``, ``"true"``; a key
equal to one before it in its dict: below). A
trailing comma is allowed where Python allows it; comments and line
breaks between tokens are blank space. Anything else (a positional or
``**`` argument, a tuple, a set, a name, a call, a bytes or f-string, a
complex number, an infinite float) is where the text stops being a call's
arguments (``error``).

A keyword given twice is written twice (``f(a=1, a=2)``: ``{"a": 1, "a":
2}``), as ``canonical_json.py`` writes a JSON key given twice, so that
what is streamed never changes: ``json.loads`` reads the text as the
object vLLM's parser makes, the last value at the first one's place.
Python's parser, which vLLM's reads the call with, takes such a call (only
compiling it is an error), and vLLM keeps each keyword's last value.
Likewise a dict key that Python holds equal to a key before it in the
same dict (``True``, ``1`` and ``1.0`` are one key; ``"1"`` is another):
the Python dict vLLM builds has one member for them, under the first
key, with the last value, and ``json.dumps`` writes that key as it writes
the first one (``{True: 1, 1: 'x'}``: ``{"true": "x"}``). Here the later
key is written with the first one's spelling (``{"true": 1, "true":
"x"}``), which ``json.loads`` reads as that same object.

The call is ``known`` once its first value has begun to be written (a
string's quote, a list's or dict's bracket, a number or word once
settled), or its ``)`` came right after the ``(``: a call without
arguments; before, text that is no call's arguments is no call.
``written`` holds the canonical text settled so far (``out``: it
joined), never changed later: a number, a word, a keyword and a
comma wait for the character after them (a comma may be a trailing one),
a string's characters go out as they come but an escape waits until it is
whole and the closing quote until the next token shows no string joins it.
``end`` is the index just past the ``)``.
"""

from __future__ import annotations

import ast
import json
import re
import warnings

from checkpoint.growing_text import GrowingText

_BLANK = " \t\r\n\f"
_NUMBER = re.compile(r"[0-9A-Za-z_.]")
_PLAIN_SINGLE = {"'": re.compile(r"[^'\\\n]+"), '"': re.compile(r'[^"\\\n]+')}
_PLAIN_TRIPLE = {"'": re.compile(r"[^'\\]+"), '"': re.compile(r'[^"\\]+')}
_PREFIXES = {"r", "u", "R", "U"}
_WORDS = {"True": "true", "False": "false", "None": "null"}
_VALUES = {"True": True, "False": False, "None": None}
# An escape that is whole, and one that may still become one.
_ESCAPE_SO_FAR = re.compile(r"\\(?:x[0-9a-fA-F]?|u[0-9a-fA-F]{0,3}|U[0-9a-fA-F]{0,7}"
                            r"|N(?:\{[^}\n]*)?)")
_NAME_END = re.compile(r"[}\n]")  # what ends the name of a \N{...} escape
_LINE_END = re.compile(r"[\r\n]")  # a comment's end: "\r" ends a line for Python too
_ESCAPE = re.compile(r"\\(?:[0-7]{1,3}|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}"
                     r"|N\{[^}\n]*\}|[^0-7xuUN])")


class PythonArguments:
    """The arguments of the call whose ``(`` is just before ``at``; ``scan``
    reads on (``last``: the text is whole, so a number or word at its end
    is settled)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.written = GrowingText()  # the canonical text settled so far (``out``: joined)
        self.header_end: int | None = None  # the end of the first keyword's "key": in written
        self.end: int | None = None
        self.error: int | None = None
        self.stack = ["("]  # the open argument list, lists and dicts
        # for each open dict, its keys other than strings so far: each
        # key's value (as Python compares keys) -> the text it is written as
        self.keys: list[dict[object, str]] = []
        self.expect = "keyword"
        self.comma = False  # a comma read, its ", " not yet written
        self.first = True  # the open container has no item yet
        self.word = ""  # the keyword, word or number last read, from word_start
        self.word_start = 0
        self.sign = ""  # a number's sign
        self.at_key = False  # the value being read is a dict's key
        self.quote = ""  # the open string's quote(s)
        self.raw = False
        self.joined = False  # the string being read joins the one before
        self.in_comment = False
        self.name_searched = 0  # how far the search for a \N{ escape's "}" got

    @property
    def known(self) -> bool:
        """Whether the text is a call: its first value has begun (some of it
        written), or its ``)`` came right after the ``(``."""
        return self.end is not None or (self.header_end is not None
                                        and self.written.size > self.header_end)

    def scan(self, text: str, last: bool = False) -> None:
        while self.end is None and self.error is None and self.at < len(text):
            if self.in_comment:
                self._comment(text)
                continue
            before = self.at, self.expect
            getattr(self, "_" + self.expect)(text, last)
            if (self.at, self.expect) == before and self.error is None and self.end is None:
                return  # waits for more text
        if not last or self.end is not None or self.error is not None:
            return
        if self.expect in ("number", "word"):  # settled by the text's end
            getattr(self, "_" + self.expect)(text.plus(" "), True)
        elif self.expect == "string_end":
            self._write('"')
            self._ended()

    def needed_from(self) -> int:
        """Where the text ``scan`` may still read starts: the keyword,
        number or word being read, or ``at``."""
        if self.expect in ("keyword_name", "equals", "number", "word"):
            return min(self.at, self.word_start)
        return self.at

    # -- the argument list ------------------------------------------------

    def _keyword(self, text: str, last: bool) -> None:
        char = text[self.at]
        if self._blank(text):
            return
        if char == ")":
            self._close(char)
        elif (char + "a").isidentifier():
            self.word, self.word_start, self.expect = "", self.at, "keyword_name"
        else:
            self.error = self.at

    def _keyword_name(self, text: str, last: bool) -> None:
        if ("a" + text[self.at]).isidentifier():  # as ("a" + name + char) would be
            self.at += 1
        else:
            self.word, self.expect = text[self.word_start:self.at], "equals"

    def _equals(self, text: str, last: bool) -> None:
        if self._blank(text):
            return
        if text[self.at] != "=":
            self.error = self.at
            return
        if self.at + 1 == len(text) and not last:
            return  # "==" would be no keyword
        if text.startswith("==", self.at):
            self.error = self.word_start
            return
        self._item_start()
        self._write(json.dumps(self.word, ensure_ascii=False) + ": ")
        if self.header_end is None:
            self.header_end = self.written.size
        self.at += 1
        self.expect = "value"

    # -- values -----------------------------------------------------------

    def _value(self, text: str, last: bool) -> None:
        """A value (or a dict's key, ``at_key``) starts here."""
        if self._blank(text):
            return
        char = text[self.at]
        if self.sign and not (char.isdigit() or char == "."):
            self.error = self.at
        elif char in "[{" and not self.at_key:
            self._write(char)
            self.stack.append(char)
            if char == "{":
                self.keys.append({})
            self.first, self.comma = True, False
            self.expect = "item" if char == "[" else "key"
            self.at += 1
        elif char in "'\"":
            self._open_string(text, last, "")
        elif char.isdigit() or char == ".":
            self.word, self.word_start, self.expect = "", self.at, "number"
        elif char in "+-" and not self.at_key:
            self.sign, self.word_start = char, self.at
            self.at += 1
        elif (char + "a").isidentifier():
            self.word, self.word_start, self.expect = "", self.at, "word"
        else:
            self.error = self.at

    def _item(self, text: str, last: bool) -> None:
        """In a list: its next element, or its ``]``."""
        if self._blank(text):
            return
        if text[self.at] == "]":
            self._close("]")
            return
        self._item_start()
        self.expect = "value"

    def _key(self, text: str, last: bool) -> None:
        """In a dict: its next key, or its ``}``."""
        if self._blank(text):
            return
        if text[self.at] == "}":
            self._close("}")
            return
        self._item_start()
        self.at_key, self.expect = True, "value"

    def _colon(self, text: str, last: bool) -> None:
        if self._blank(text):
            return
        if text[self.at] != ":":
            self.error = self.at
            return
        self._write(": ")
        self.at += 1
        self.expect = "value"

    def _after(self, text: str, last: bool) -> None:
        """After a value: a comma, or its container's close."""
        if self._blank(text):
            return
        char = text[self.at]
        if char == ",":
            self.comma = True
            self.at += 1
            self.expect = {"(": "keyword", "[": "item", "{": "key"}[self.stack[-1]]
        elif char == {"(": ")", "[": "]", "{": "}"}[self.stack[-1]]:
            self._close(char)
        else:
            self.error = self.at

    def _close(self, char: str) -> None:
        opened = self.stack.pop()
        if opened == "{":
            self.keys.pop()
        if opened == "(" and self.first:
            self._write("{")
        self._write("}" if opened in "({" else "]")
        self.comma, self.first = False, False
        self.at += 1
        if not self.stack:
            self.end = self.at
        else:
            self.expect = "after"

    def _item_start(self) -> None:
        """An item of the open container starts: its separator first."""
        if self.first:
            if self.stack[-1] == "(":
                self._write("{")
            self.first = False
        elif self.comma:
            self._write(", ")
            self.comma = False

    def _ended(self) -> None:
        """A value has ended: a key's colon or the next item comes."""
        self.sign = ""
        if self.at_key:
            self.at_key = False
            self.expect = "colon"
        else:
            self.expect = "after"

    # -- numbers and words ------------------------------------------------

    def _number(self, text: str, last: bool) -> None:
        char = text[self.at]
        if _NUMBER.match(char) or (char in "+-" and self._after_exponent(text)):
            self.at += 1
            return
        self.word = text[self.word_start:self.at]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = ast.literal_eval(self.word)
            if type(value) not in (int, float):
                raise ValueError
            written = json.dumps(-value if self.sign == "-" else value, allow_nan=False)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            self.error = self.word_start
            return
        self._write(self._key_text(value, written) if self.at_key else written)
        self._ended()

    def _key_text(self, value: object, written: str) -> str:
        """The text of a dict key other than a string, ``value`` written
        ``written`` as a value: the first equal key's text in its dict
        (Python's dict keeps that key), else ``written`` quoted, as
        ``json.dumps`` writes a key."""
        return self.keys[-1].setdefault(value, f'"{written}"')

    def _after_exponent(self, text: str) -> bool:
        """Whether the number so far ends in an exponent's ``e`` (a sign
        may follow), which a hexadecimal or binary one has none of."""
        first_two = text[self.word_start:min(self.at, self.word_start + 2)]
        return (self.at > self.word_start and text[self.at - 1] in "eE"
                and first_two.lower() not in ("0x", "0b"))

    def _word(self, text: str, last: bool) -> None:
        char = text[self.at]
        if ("a" + char).isidentifier():
            self.at += 1
            return
        self.word = text[self.word_start:self.at]
        if char in "'\"" and self.word in _PREFIXES:
            self._open_string(text, last, self.word)
        elif self.word in _WORDS:
            written = _WORDS[self.word]
            self._write(self._key_text(_VALUES[self.word], written) if self.at_key else written)
            self._ended()
        else:
            self.error = self.word_start

    # -- strings ----------------------------------------------------------

    def _open_string(self, text: str, last: bool, prefix: str) -> None:
        char = text[self.at]
        if text.startswith(char * 3, self.at):
            quote = char * 3
        elif not last and len(text) - self.at < 3 and text[self.at:] in (char, char * 2):
            return  # one or two quotes so far: maybe a triple quote
        else:
            quote = char
        if not self.joined:
            self._write('"')
        self.quote, self.raw, self.joined = quote, prefix in ("r", "R"), False
        self.at += len(quote)
        self.expect = "string"

    def _string(self, text: str, last: bool) -> None:
        char, quote = text[self.at], self.quote
        if char == "\\":
            self._escape(text, last)
        elif char == quote[0]:
            if len(quote) == 1 or text.startswith(quote, self.at):
                self.at += len(quote)
                self.expect = "string_end"
            elif not last and len(text) - self.at < 3 and quote.startswith(text[self.at:]):
                return  # one or two quotes at the end: maybe the closing three
            else:
                self._decoded(char)
                self.at += 1
        elif char == "\n" and len(quote) == 1:
            self.error = self.at
        else:
            plain = (_PLAIN_SINGLE if len(quote) == 1 else _PLAIN_TRIPLE)[quote[0]]
            end = text.match(plain, self.at).end()
            self._decoded(text[self.at:end])
            self.at = end

    def _escape(self, text: str, last: bool) -> None:
        rest = text[self.at:self.at + 12]
        if len(rest) < 2:
            if last:
                self.error = self.at
            return  # the escape's next character has not come
        if self.raw:  # a backslash and the character after it, both kept
            self._decoded(rest[:2])
            self.at += 2
            return
        if rest.startswith("\\N{"):  # its name waits for a "}" (or breaks at a line's end)
            if text.search(_NAME_END, max(self.at + 3, self.name_searched)) is None:
                self.name_searched = len(text)
                if last:
                    self.error = self.at
                return
        found = text.match(_ESCAPE, self.at)
        if found is None:
            if last or not text.fullmatch(_ESCAPE_SO_FAR, self.at):
                self.error = self.at
            return  # \x, \u, \U or \N{ not yet whole
        if not last and found.end() == len(text) and rest[1] in "01234567" \
                and len(found.group()) < 4:
            return  # an octal escape may take more digits
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                decoded = ast.literal_eval('"' + found.group() + '"')
        except (SyntaxError, ValueError):
            self.error = self.at
            return
        self._decoded(decoded)
        self.at = found.end()

    def _string_end(self, text: str, last: bool) -> None:
        """After a string's closing quote: another string joins it (its
        quote, or a prefix and its quote), or its JSON string closes."""
        if self._blank(text):
            return
        char = text[self.at]
        if char in "'\"":
            self.joined = True
            self._open_string(text, last, "")
            return
        if char in _PREFIXES:
            if self.at + 1 == len(text) and not last:
                return  # maybe a prefix
            if text[self.at + 1:self.at + 2] in ("'", '"'):
                self.joined = True
                self.at += 1
                self._open_string(text, last, char)
                if self.expect != "string":  # waits for the quotes: read the prefix again
                    self.at -= 1
                return
        self._write('"')
        self._ended()

    def _decoded(self, chars: str) -> None:
        self._write(json.dumps(chars, ensure_ascii=False)[1:-1])

    # -- blank space and output --------------------------------------------

    def _blank(self, text: str) -> bool:
        """Skips blank space or a comment at ``at`` (True), or says there
        is none there (False); a comment waits for its line's end."""
        char = text[self.at]
        if char in _BLANK:
            self.at += 1
            return True
        if char == "#":
            self.in_comment = True
            self._comment(text)
            return True
        return False

    def _comment(self, text: str) -> None:
        """Inside a comment: up to its line's end (a "\r" or "\n")."""
        end = text.search(_LINE_END, self.at)
        self.at = len(text) if end is None else end.start()
        self.in_comment = end is None

    def _write(self, text: str) -> None:
        self.written.add(text)

    @property
    def out(self) -> str:
        return str(self.written)
