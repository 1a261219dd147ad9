"""``StreamedText``: a model's answer as it arrives in pieces, read at
absolute positions (a position counts from the answer's first character,
whatever has been let go), keeping only the text still needed.

The tool-call readers read each new piece from cursors that sit at, or a
few characters before, the end of the text read so far, and now and then
look back at a bounded span further back (a tag's start, a name, a
number) or take the text held since a call began as content. So the text
is kept two ways: ``window``, one string of the newest piece and the
``LOOKBACK`` characters before it, which searches and regular expressions
run on; and the pieces themselves, from the first position a reader may
still read (``release``), which spans further back are joined from. A
piece costs its length and the lookback, never the text before it,
whether or not the Python at hand can extend a string where it lies; a
span costs its length and the pieces it crosses. A search that starts
before the window is run on the text joined from its start to the end,
which costs that text: the readers only do so once per token.

Regular expressions are matched through ``match``, ``search`` and
``fullmatch``, which give positions in the whole text (``Found``). They
must not look behind their starting position (no lookbehind, ``\\b`` or
anchors), as the text before it may not be in the string they run on;
and for ``match`` and ``search``, a match that ends before the end of a
string must be the match in any longer string that starts with it (a run
of one class of characters, a bounded alternative: what the readers
match), so that a look at an earlier position reads only as far as it
goes (``_near``)."""

from __future__ import annotations

import copy
import re
from bisect import bisect_right
from dataclasses import dataclass


@dataclass(frozen=True)
class Found:
    """A regular expression's match, at positions in the whole text."""

    begin: int
    finish: int
    text: str

    def start(self) -> int:
        return self.begin

    def end(self) -> int:
        return self.finish

    def group(self) -> str:
        return self.text


class StreamedText:
    """``size``: the text's length so far; ``kept``: where the kept text
    starts (reading before it is a reader's bug: ``LookupError``);
    ``pieces`` and ``starts``: the kept pieces and where each starts
    (from index ``first`` on); ``window``: the text from
    ``window_start`` to the end."""

    LOOKBACK = 64

    def __init__(self, text: str = "") -> None:
        self.size = 0
        self.kept = 0
        self.pieces: list[str] = []
        self.starts: list[int] = []
        self.first = 0
        self.window = ""
        self.window_start = 0
        self.add(text)

    def add(self, piece: str) -> None:
        if not piece:
            return
        self.starts.append(self.size)
        self.pieces.append(piece)
        self.size += len(piece)
        behind = min(len(self.window), self.LOOKBACK)
        self.window = self._joined([self.window[len(self.window) - behind:], piece])
        self.window_start = self.size - len(self.window)

    def plus(self, suffix: str) -> StreamedText:
        """A copy with ``suffix`` added (this text unchanged)."""
        twin = copy.copy(self)
        twin.pieces, twin.starts = list(self.pieces), list(self.starts)
        twin.add(suffix)
        return twin

    def release(self, upto: int) -> None:
        """Nothing before ``upto`` will be read again: the pieces wholly
        before it are let go."""
        self.kept = max(self.kept, min(upto, self.size))
        while self.first + 1 < len(self.pieces) and self.starts[self.first + 1] <= self.kept:
            self.first += 1
        if self.first > 32 and self.first * 2 > len(self.pieces):  # drop them, now and then
            del self.pieces[:self.first], self.starts[:self.first]
            self.first = 0

    def __len__(self) -> int:
        return self.size

    def __str__(self) -> str:
        return self[self.kept:]

    def __getitem__(self, at: int | slice) -> str:
        if isinstance(at, slice):
            start = 0 if at.start is None else at.start
            end = self.size if at.stop is None else min(at.stop, self.size)
            return self.span(start, end)
        if not 0 <= at < self.size:
            raise IndexError(at)
        if at >= self.window_start:
            return self.window[at - self.window_start]
        return self.span(at, at + 1)

    def span(self, start: int, end: int) -> str:
        """The text from ``start`` to ``end`` (within the text so far)."""
        if start >= end:
            return ""
        if start >= self.window_start:
            return self.window[start - self.window_start:end - self.window_start]
        if start < self.kept:
            raise LookupError(f"text at {start} was let go (kept from {self.kept})")
        first = bisect_right(self.starts, start, self.first) - 1
        parts = []
        for index in range(first, len(self.pieces)):
            piece_start = self.starts[index]
            if piece_start >= end:
                break
            piece = self.pieces[index]
            parts.append(piece[max(start - piece_start, 0):end - piece_start])
        return self._joined(parts)

    def _joined(self, parts: list[str]) -> str:
        return "".join(parts)

    def _from(self, start: int) -> tuple[str, int]:
        """A string that holds the text from ``start`` to the end, and the
        position its first character has."""
        if start >= self.window_start:
            return self.window, self.window_start
        return self.span(start, self.size), start

    def _near(self, start: int, look) -> tuple[str, int, object]:
        """``look(string)`` on the text from ``start``: the window where it
        holds ``start``; else spans of it that double from a short one
        until ``look`` settles (what it found ends before the span's end)
        or the span reaches the text's end. So a look at an earlier
        position costs what it goes over, not the text after it."""
        if start >= self.window_start:
            return self.window, self.window_start, look(self.window, start - self.window_start)
        size = 16
        while True:
            end = min(self.size, start + size)
            string = self.span(start, end)
            found = look(string, 0)
            if end == self.size or (found is not None and found.end() < len(string)):
                return string, start, found
            size *= 2

    # -- searches, at positions in the whole text ----------------------------

    def find(self, sub: str, start: int) -> int:
        def look(string: str, at: int):
            found = string.find(sub, at)
            return None if found < 0 else Found(found, found + len(sub), sub)

        _, offset, found = self._near(start, look)
        return -1 if found is None else found.begin + offset

    def startswith(self, prefix: str, start: int) -> bool:
        return self.span(start, start + len(prefix)) == prefix

    def match(self, pattern: re.Pattern, start: int) -> Found | None:
        _, offset, found = self._near(start, pattern.match)
        return _found(found, offset)

    def search(self, pattern: re.Pattern, start: int) -> Found | None:
        _, offset, found = self._near(start, pattern.search)
        return _found(found, offset)

    def fullmatch(self, pattern: re.Pattern, start: int) -> Found | None:
        string, offset = self._from(start)
        return _found(pattern.fullmatch(string, start - offset), offset)


def _found(found: re.Match | None, offset: int) -> Found | None:
    if found is None:
        return None
    return Found(found.start() + offset, found.end() + offset, found.group())
