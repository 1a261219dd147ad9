"""``AutoCallsReader``: what the tool-call parsers of tool_choice "auto"
share (``tool_parsers.py``, ``qwen3_coder.py``): the answer read as
``content before | a run of calls | content after``, a state machine over
the text that settles what it can of each new piece, and the content and
calls it lets out.

Each character of the answer is searched a bounded number of times, so a
reader's work is linear in the answer's length, however small the pieces
it comes in: a search that waits for more text (for a tag, or for the end
of a run of blank space or of a name) goes on, when the text grows, from
where it stopped (``_find``, ``_run_end``) instead of from its start. Nor
is any text copied whole for a piece: the answer's text is a
``StreamedText``, whose searches run on the newest piece and a bounded
lookback, and which keeps only the text from where the reader may still
read (``_kept_from``: its cursors, and where content would start if the
piece being read turned out to be no call); the content and each call's
arguments are kept as pieces (``GrowingText``, ``CallList``) and a
call's deltas are read from where the last one stopped."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from checkpoint.growing_text import GrowingText
from serving.http.call_object import CallObject
from serving.http.streamed_text import StreamedText
from serving.http.tools import CallList, ToolCallReader, new_tool_call_id

BLANK = re.compile(r"\s*")


class AutoCallsReader(ToolCallReader):
    """What the parsers share: the request's ``tools`` (each tool's
    parameters schema by its name: None or {} where none are known), the
    answer's text so far (``text``, read at positions in the whole
    answer), the content (``said``) and calls (``list``)
    settled so far, and what the current piece of text lets out.
    Subclasses implement ``_advance``, which settles as much of
    ``text`` as it can (all of it when ``last``) through ``_say`` and
    ``_read`` (a call object's streamed call) or ``list`` (``CallList``)
    directly; a call gets its id from ``_new_id``; and ``_needed_from``,
    where the text their state may still read starts. The parsers here are state
    machines: ``STEPS`` names each state's method, which settles what it
    can and says whether to go on (the state it leaves in ``state``).
    ``searched`` holds how far each search of the current state got; a
    state that moves on (its method returns True) starts its searches
    afresh."""

    STEPS: ClassVar[dict[str, str]] = {}

    def __init__(self, tools: dict[str, dict] | None = None) -> None:
        self.tools = tools or {}
        self.text = StreamedText()
        self.said = GrowingText()
        self.list = CallList(self._new_id)
        self.rest_start: int | None = None  # where the content after the run starts
        self.done = False
        self.searched: dict[tuple[str | re.Pattern, int], int] = {}
        self._pieces: list[tuple[str, Any]] = []  # what the current text lets out

    @property
    def found(self) -> list[dict]:
        return self.list.found

    @property
    def content(self) -> str:
        return str(self.said)

    def pieces(self, text: str, last: bool = False) -> list[tuple[str, Any]]:
        self.text.add(text)
        if not self.done:
            self._advance(last)
        if self.rest_start is not None:
            self._say(self.text[self.rest_start:])
            self.rest_start = len(self.text)
        if last:
            self.done = True
        self.text.release(self._kept_from())
        pieces, self._pieces = self._pieces, []
        return pieces

    def _kept_from(self) -> int:
        """Where the text this reader may still read starts: nothing
        before it is kept. Once the run is over, only the content after it
        is read (from ``rest_start``); before, the state says
        (``_needed_from``)."""
        if self.rest_start is not None:
            return self.rest_start
        return len(self.text) if self.done else self._needed_from()

    def _needed_from(self) -> int:
        """Where the text the current state may still read starts: its
        cursors, and where content would start if the piece being read
        turned out to be no call."""
        raise NotImplementedError

    def _advance(self, last: bool) -> None:
        while not self.done:
            if not getattr(self, self.STEPS[self.state])(last):
                return
            self.searched.clear()

    def _find(self, tag: str, start: int) -> int:
        """``text.find(tag, start)``, going on from where the last search
        for ``tag`` from ``start`` stopped: the text only grows, so a tag
        found stays found, and one not found can only start in the last
        ``len(tag) - 1`` characters searched or after them."""
        key = (tag, start)
        found = self.text.find(tag, self.searched.get(key, start))
        self.searched[key] = found if found >= 0 else max(start, len(self.text) - len(tag) + 1)
        return found

    def _run_end(self, run: re.Pattern, start: int) -> int:
        """``run.match(text, start).end()`` for a ``run`` that matches the
        longest run of one kind of character (``[...]*``, ``\\s*``), going
        on from where the last look from ``start`` stopped: a run that
        reached the text's end may go on in the text that comes."""
        key = (run, start)
        end = self.text.match(run, self.searched.get(key, start)).end()
        self.searched[key] = end
        return end

    def _say(self, text: str) -> None:
        if text:
            self.said.add(text)
            self._pieces.append(("content", text))

    def _entries(self, entries: list[dict]) -> None:
        self._pieces += [("call", entry) for entry in entries]

    def _read(self, call: CallObject, last: bool) -> str:
        """Reads on in ``call`` and sends what its call settled: "open"
        (it goes on), "no call" (it is none, or the answer ended before it
        was known), "end" (its object closed: ``call.end``), "broken" (its
        JSON broke off after its call was known: ``call.error``), "cut"
        (the answer ended in it, after its call was known)."""
        call.scan(self.text, last)
        if call.failed or not call.started:
            return "no call" if call.failed or last else "open"
        self._entries(self.list.follow(call, call.name, call.arguments_from))
        if call.end is not None:
            return "end"
        if call.error is not None:
            return "broken"
        return "cut" if last else "open"

    def _new_id(self) -> str:
        return new_tool_call_id()

    def _say_until(self, tag: str, last: bool) -> int | None:
        """Content from ``at`` up to the first ``tag``: where it is, or
        None (then a tail that may be the tag's start waits for more text,
        and all of it is content when ``last``)."""
        found = self.text.find(tag, self.at)
        if found >= 0:
            self._say(self.text[self.at:found])
            return found
        if last:
            self._say(self.text[self.at:])
            self.done = True
            return None
        held = open_tag_tail(self.text, self.at, tag)
        self._say(self.text[self.at:len(self.text) - held])
        self.at = len(self.text) - held
        return None

    def _next_tag(self, tag: str, last: bool) -> int | None:
        """After a piece of the run, at ``at``: blank space, then where
        ``tag`` starts the next piece; None if it does not (blank space to
        the end: the answer is done where ``last``, the run ends at other
        text) or may not yet be known."""
        start = self._run_end(BLANK, self.at)
        if self.text.startswith(tag, start):
            return start
        if not last and tag.startswith(self.text[start:start + len(tag)]):
            return None  # blank space so far, or a partial tag
        if start == len(self.text):
            self.done = True
        else:
            self._rest_from(start)
        return None

    def _rest_from(self, at: int) -> None:
        """The run ends at ``at``: all text from there on is content."""
        self.rest_start = at
        self.done = True

    def calls(self) -> list[dict]:
        return list(self.found)

    def message(self) -> dict:
        if not self.list:
            return {"content": self.content}
        return {"content": self.content or None, "tool_calls": self.calls()}

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.list else reason


def open_tag_tail(text: StreamedText, start: int, tag: str) -> int:
    """How many characters at the end of ``text[start:]`` may be the start
    of ``tag`` (its longest proper prefix there)."""
    for size in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if tag.startswith(text[len(text) - size:]):
            return size
    return 0
