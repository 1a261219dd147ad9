"""``CallObject``: a JSON object that stands for a tool call, ``{"name":
..., "arguments": {...}}``, read while its text arrives, so that the
call's arguments can be streamed.

A call object is an object whose first ``"name"`` member is a string and
that has a member under one of the argument keys (the first such member
given is the call's arguments: any JSON value). The call's ``arguments``
is the canonical text of that value (``canonical_json.py``: the text
``json.dumps`` writes for it, vLLM's arguments text), settled as the
model's text comes.

The call is known (``started``) once its name is whole and its
arguments' value has begun, in whichever order the two members come;
from then on the arguments settled so far can go out. Before that, text
that turns out not to be a call object (not JSON, a name that is not a
string, an object closed without a name or arguments) is no call:
``failed``. After it, the call stays whatever follows: JSON text that
breaks off (``json.error``) ends the arguments where they are.
"""

from __future__ import annotations

import json

from serving.http.canonical_json import CanonicalJson


class CallObject(CanonicalJson):
    """The call object whose ``{`` (or blank space before it) is at
    ``at``; ``argument_keys``: the keys its arguments may be under;
    ``default``: the arguments' canonical text where the object has none
    (None: such an object is no call). ``scan`` reads on; then ``name``
    (None until whole), ``started`` and ``arguments`` (the canonical text
    of the arguments settled so far) tell what is known; ``end`` (just
    past the ``}``) or ``error`` (where the text stops being JSON) where
    the object is over."""

    def __init__(self, at: int, argument_keys: tuple[str, ...],
                 default: str | None = None) -> None:
        super().__init__(at)
        self.argument_keys = argument_keys
        self.default = default
        self.name: str | None = None
        self.name_seen = False
        self.bad_name = False  # the first "name" is not a string
        self.member: tuple[str, int] | None = None  # the name or arguments being read,
        # and where its value starts in ``written``
        self.arguments_start: int | None = None  # where the arguments start in ``written``
        self.arguments_end: int | None = None

    def scan(self, text: str, last: bool = False) -> None:
        if not self.written.size and self.error is None:  # the object's "{" comes first
            while self.at < len(text) and text[self.at] in " \t\n\r":
                self.at += 1
            if self.at < len(text) and text[self.at] != "{":
                self.error = self.at
                return
        super().scan(text, last)

    @property
    def started(self) -> bool:
        return self.name is not None and (self.arguments_start is not None
                                          or self.end is not None and self.default is not None)

    @property
    def failed(self) -> bool:
        """It is no call: broken, or over, before its call was known."""
        if self.bad_name:
            return True
        return not self.started and (self.error is not None or self.end is not None)

    @property
    def arguments(self) -> str:
        """The arguments' canonical text settled so far ("" before they
        start; the default for an object over without them)."""
        return self.arguments_from(0)

    def arguments_from(self, start: int) -> str:
        """``arguments[start:]``, read from ``written`` without the text
        before it: a stream's next piece of arguments."""
        if self.arguments_start is None:
            default = self.default if self.end is not None and self.default is not None else ""
            return default[start:]
        end = self.arguments_end if self.arguments_end is not None else self.written.size
        return self.written.span(self.arguments_start + start, end)

    def _member_start(self, key: str, written_so_far: int) -> None:
        if key == "name" and not self.name_seen:
            self.name_seen, self.member = True, ("name", written_so_far)
        elif key in self.argument_keys and self.arguments_start is None:
            self.arguments_start, self.member = written_so_far, ("arguments", written_so_far)
        else:
            self.member = None

    def _member_end(self, key: str, written_so_far: int) -> None:
        if self.member is None:
            return
        which, start = self.member
        self.member = None
        if which == "arguments":
            self.arguments_end = written_so_far
            return
        name = json.loads(self.written.span(start, written_so_far))
        if isinstance(name, str):
            self.name = name
        else:
            self.bad_name = True
