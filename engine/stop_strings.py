"""Stop strings, matched on the text as it is released, piece by piece.

``StopStringMatcher.feed`` takes each new piece of text and returns the
part that is safe to show: text that cannot be the start of a stop string.
It holds back the longest tail of the unreleased text that is a proper
prefix of some stop string, so a stop string split across pieces (or
tokens) is still found, and none of it is ever shown. Once a stop string
is found, the text before it is released, the rest is dropped and
``stopped`` is set; ``flush`` releases the held-back tail when the output
ends without one.

The rule is vLLM's: the output stops at the first piece whose text
completes a stop string (one that ends in the piece); where that piece
completes several, the first of them in the request's list wins (vLLM
checks them in that order), at its first occurrence that ends in the
piece. Invariant: the concatenation of everything ``feed`` and ``flush``
return equals the text up to that piece, cut before that occurrence (the
whole text when no piece completes one); with ``include_stop`` (vLLM's
``include_stop_str_in_output``) cut after it. Text given to ``release``
(a request still below its ``min_tokens``) ends no stop string, but one
may begin in it: as vLLM, which looks for stop strings only once
``min_tokens`` are out, each time over the new text and the stop string's
length before it. So ``release`` holds back the same tail as ``feed``.

Cost: a piece costs lookups in the request's stop strings, not a pass
over them: the stop strings are kept as a dict (to their place in the
list) and a sorted tuple, so finding those that end in the new text takes
one dict lookup per position and distinct stop length, and the held-back
tail one binary search per candidate length. A request with many stop
strings (up to ``MAX_STOP_STRINGS``) costs each token about what one with
a few does.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

# Stop strings a request may give (as many as its other lists' entries).
MAX_STOP_STRINGS = 1024


class StopStringMatcher:
    def __init__(self, stops: Sequence[str], include_stop: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError("a stop string must not be empty")
        self.stops = tuple(stops)
        self._place: dict[str, int] = {}  # each stop string's first place in the list
        for i, stop in enumerate(self.stops):
            self._place.setdefault(stop, i)
        self._sorted = tuple(sorted(self._place))
        self._lengths = sorted({len(s) for s in self._place})
        self._longest = self._lengths[-1] if self._lengths else 0
        self.include_stop = include_stop
        self.pending = ""  # received, not released: a possible stop-string start
        self.stopped: str | None = None  # the stop string found

    def feed(self, piece: str) -> str:
        """Add ``piece``; return the text now safe to release (up to a stop
        string the piece completes, which ends the output)."""
        if self.stopped is not None or not piece:
            return ""
        if not self.stops:
            return piece
        text = self.pending + piece
        found = self._completed(text, len(self.pending))
        if found is not None:
            self.pending = ""
            return self._cut(text, found)
        return self._hold_from(text, len(text) - self._held_tail(text))

    def release(self, piece: str) -> str:
        """Add ``piece``, which ends no stop string (the output is still below
        its ``min_tokens``); return the text now safe to release. The tail
        that may begin a stop string is held back as ``feed`` holds it."""
        if self.stopped is not None or not piece:
            return ""
        text = self.pending + piece
        return self._hold_from(text, len(text) - self._held_tail(text))

    def _hold_from(self, text: str, held: int) -> str:
        """Keep ``text[held:]`` pending, release the rest."""
        self.pending = text[held:]
        return text[:held]

    def flush(self) -> str:
        """The held-back text, once no more text will come (a stop string
        it holds was completed by no piece: it would have been found)."""
        text, self.pending = self.pending, ""
        return "" if self.stopped is not None else text

    def _cut(self, text: str, found: tuple[int, str]) -> str:
        """``text`` up to the stop string ``found`` (its index and itself),
        which ends the output."""
        index, self.stopped = found
        return text[: index + len(self.stopped)] if self.include_stop else text[:index]

    def _completed(self, text: str, new_from: int) -> tuple[int, str] | None:
        """(index, stop string) of the stop string that ``text[new_from:]``
        completes (one that ends there), the first in the list where it
        completes several, at its first occurrence ending there; None if
        it completes none."""
        best = None  # (place in the list, index)
        for end in range(new_from + 1, len(text) + 1):
            for n in self._lengths:
                if n > end:
                    break
                place = self._place.get(text[end - n:end])
                if place is not None and (best is None or (place, end - n) < best):
                    best = (place, end - n)
        return None if best is None else (best[1], self.stops[best[0]])

    def _held_tail(self, text: str) -> int:
        """Length of the longest tail of ``text`` that a stop string starts
        with (a proper start: a whole one there has ended the output, or lies
        in text that ends none)."""
        for n in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-n:]
            # The first stop string not below ``tail`` starts with it, if any does.
            i = bisect.bisect_left(self._sorted, tail)
            if i < len(self._sorted) and self._sorted[i].startswith(tail) \
                    and len(self._sorted[i]) > n:
                return n
            # A stop string equal to ``tail`` sorts first; a longer one may follow it.
            if i + 1 < len(self._sorted) and self._sorted[i] == tail \
                    and self._sorted[i + 1].startswith(tail):
                return n
        return 0


class OutputStops:
    """One output's text through its ``StopStringMatcher``, piece by piece,
    with the rule of ``min_tokens``: a piece whose tokens all lie within
    the first ``min_tokens`` output tokens ends no stop string
    (``release``), later ones may (``feed``); the output's last piece
    also releases what is held back (``flush``). The text of the stop token
    that ended the request in the engine, where it is shown
    (``include_stop_str_in_output``), is read like any other: vLLM checks
    the stop strings over it too, and one it completes becomes the reason.
    ``stopped``: the stop string met, once met: the piece just added
    completed it (the caller then ends the request, keeping the tokens up
    to that piece). Pieces may be one token's text (``LLM``, the engine
    client, the HTTP server) or several tokens'."""

    def __init__(self, stops: Sequence[str], include_stop: bool = False,
                 min_tokens: int = 0) -> None:
        self.matcher = StopStringMatcher(stops, include_stop)
        self.min_tokens = min_tokens
        self.num_tokens = 0

    @property
    def stopped(self) -> str | None:
        return self.matcher.stopped

    def add(self, piece: str, num_tokens: int, last: bool = False) -> str:
        """The text now safe to show, after ``piece`` of ``num_tokens`` more
        tokens; ``last``: no more will come."""
        self.num_tokens += num_tokens
        if self.num_tokens <= self.min_tokens:
            text = self.matcher.release(piece)  # too early for a stop string
        else:
            text = self.matcher.feed(piece)
        if last and self.stopped is None:
            text += self.matcher.flush()
        return text
