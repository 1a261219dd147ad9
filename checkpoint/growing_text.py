"""``GrowingText``: text that is only ever added to, kept as the pieces it
came in (every ``CHUNK_PIECES`` of them joined into one), for text written
a token or a piece at a time: the incremental detokenizer's released text,
what the tool-call and reasoning readers write as they read (a call's
canonical arguments, an answer's content and reasoning).

A Python string is never extended where it lies: ``out += piece`` on an
attribute copies all of ``out`` into a new string, so text written a piece
at a time would cost the square of its length. Here adding a piece costs
the piece, and reading a span costs the span and the two pieces at its
ends (found by bisection), never the text before it: a call's arguments
are streamed from where the last delta stopped (``span(start)``), and the
whole text is joined once, where it is asked for (``str``). Every
``CHUNK_PIECES`` pieces added are joined into one (each character is
copied once more): a string object kept per piece would cost tens of
bytes beyond a piece of one character, held for a request's life."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

CHUNK_PIECES = 64


class GrowingText:
    """``pieces``: the text's pieces in order, none empty; ``starts``: where
    each piece starts in the text; ``size``: the text's length."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.starts: list[int] = []
        self.size = 0
        self._loose = 0  # pieces added since the last join

    def add(self, text: str) -> None:
        if text:
            self.starts.append(self.size)
            self.pieces.append(text)
            self.size += len(text)
            self._loose += 1
            if self._loose == CHUNK_PIECES:
                self.pieces[-CHUNK_PIECES:] = ["".join(self.pieces[-CHUNK_PIECES:])]
                del self.starts[-CHUNK_PIECES + 1:]
                self._loose = 0

    def span(self, start: int, end: int | None = None) -> str:
        """``str(self)[start:end]`` (``end`` None: to the end), for ``0 <=
        start``, without joining the pieces outside it."""
        end = self.size if end is None else min(end, self.size)
        if start >= end:
            return ""
        first = bisect_right(self.starts, start) - 1
        last = bisect_left(self.starts, end)  # the pieces that start before ``end``
        offset = self.starts[first]
        return "".join(self.pieces[first:last])[start - offset:end - offset]

    def __len__(self) -> int:
        return self.size

    def __str__(self) -> str:
        return "".join(self.pieces)
