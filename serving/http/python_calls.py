"""Python call syntax, as the ``pythonic`` tool-call parser reads it: where
a call's argument list ends in text that grows (``GroupEnd``), and the
call a whole ``name(key=value, ...)`` stands for (``python_call``).

A call is read with Python's own parser (``ast``), so what Python does
not accept as an expression is no call. Its arguments are keyword
arguments whose values are literals: strings, numbers (a sign in front
allowed), True, False, None, and lists and dicts of literals, dict keys
being literals too. Each value becomes the JSON value json.dumps makes of
it; one that has no JSON spelling (bytes, complex, an infinite float,
Ellipsis) makes the text no call, and so does a positional or ``**``
argument, a keyword given twice, a name that is not a plain identifier (``a.b()``), or any
other expression as a value (a tuple, a set, a variable, a call).
"""

from __future__ import annotations

import ast
import json

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = set(_OPEN.values())


class GroupEnd:
    """Finds where the bracket group that opens at ``start`` (with ``(``,
    ``[`` or ``{``) closes, over Python text that grows, the way Python's
    tokenizer sees it: brackets inside string literals (single or triple
    quoted, a backslash escaping the next character) and comments do not
    count. ``scan`` reads on from where it stopped and returns the index
    just past the closing bracket, or None while the group is open or what
    follows may still change how the text so far reads (a quote that may
    start a triple quote); ``broken`` turns True where the text cannot be
    Python (a closing bracket that does not match, a line break inside a
    single-quoted string), and stays so."""

    def __init__(self, start: int) -> None:
        self.at = start
        self.stack: list[str] = []  # the closing bracket each open one wants
        self.quote = ""  # the open string's quotes: ', ", ''' or """ ("": none)
        self.escaped = False
        self.in_comment = False
        self.broken = False

    def scan(self, text: str, last: bool = False) -> int | None:
        while self.at < len(text) and not self.broken:
            if self.quote:
                if not self._string(text, last):
                    return None
                continue
            char = text[self.at]
            if self.in_comment:
                self.in_comment = char != "\n"
            elif char == "#":
                self.in_comment = True
            elif char in "'\"":
                if not self._open_string(text, last):
                    return None
                continue
            elif char in _OPEN:
                self.stack.append(_OPEN[char])
            elif char in _CLOSE:
                if not self.stack or self.stack.pop() != char:
                    self.broken = True
                    return None
                if not self.stack:
                    self.at += 1
                    return self.at
            self.at += 1
        return None

    def _open_string(self, text: str, last: bool) -> bool:
        """At a quote outside strings: a triple quote or a single one. One
        or two of the same quote ending the text so far may be the start of
        a triple quote: they wait for more text (False)."""
        char = text[self.at]
        if text.startswith(char * 3, self.at):
            self.quote = char * 3
        elif not last and text[self.at:] in (char, char * 2):
            return False
        else:
            self.quote = char
        self.at += len(self.quote)
        return True

    def _string(self, text: str, last: bool) -> bool:
        """One step inside a string literal; False to wait for more text."""
        char = text[self.at]
        if self.escaped:
            self.escaped = False
        elif char == "\\":
            self.escaped = True
        elif len(self.quote) == 1:
            if char == self.quote:
                self.quote = ""
            elif char == "\n":
                self.broken = True
        elif text.startswith(self.quote, self.at):
            self.quote = ""
            self.at += 3
            return True
        elif char == self.quote[0] and not last and self.quote.startswith(text[self.at:]):
            return False  # one or two quotes at the end: maybe the closing three
        self.at += 1
        return True


class NotACall(Exception):
    """The text is not a call as ``python_call`` reads one."""


def python_call(text: str) -> tuple[str, str] | None:
    """The function name and the arguments (JSON text of an object) of the
    call ``text`` is, or None where it is not one (the module's rules)."""
    try:
        tree = ast.parse(text, mode="eval")
        return _call(tree.body)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, NotACall):
        return None


def _call(node: ast.expr) -> tuple[str, str]:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        raise NotACall
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None or keyword.arg in arguments:  # **mapping, or given twice
            raise NotACall  # (Python's compiler refuses the second; its parser does not)
        arguments[keyword.arg] = _literal(keyword.value)
    return node.func.id, json.dumps(arguments, ensure_ascii=False, allow_nan=False)


def _literal(node: ast.expr):
    if isinstance(node, ast.Constant):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) in (int, float)):
        value = node.operand.value
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List):
        return [_literal(element) for element in node.elts]
    if isinstance(node, ast.Dict):
        if not all(isinstance(key, ast.Constant) for key in node.keys):
            raise NotACall  # {**mapping} has the key None; a key must be a literal
        return {key.value: _literal(value) for key, value in zip(node.keys, node.values,
                                                                 strict=True)}
    raise NotACall
