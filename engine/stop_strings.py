"""Stop strings, matched on the text as it is released, piece by piece.

``StopStringMatcher.feed`` takes each new piece of text and returns the
part that is safe to show: text that cannot be the start of a stop string.
It holds back the longest tail of the unreleased text that is a proper
prefix of some stop string, so a stop string split across pieces (or
tokens) is still found, and none of it is ever shown. Once a stop string
is found, the text before it is released, the rest is dropped and
``stopped`` is set; ``flush`` releases the held-back tail when the output
ends without one.

Invariant: the concatenation of everything ``feed`` and ``flush`` return
equals the full text cut before the earliest occurrence of any stop string
that ends in text given to ``feed`` (the whole text when there is none);
with ``include_stop`` (vLLM's ``include_stop_str_in_output``) cut after it.
Text given to ``release`` (a request still below its ``min_tokens``) ends
no stop string, but one may begin in it: as vLLM, which looks for stop
strings only once ``min_tokens`` are out, each time over the new text and
the stop string's length before it. So ``release`` holds back the same
tail as ``feed``.

Cost: a piece costs lookups in the request's stop strings, not a pass
over them: the stop strings are kept as a set and a sorted tuple, so
finding one that ends in the new text takes one set lookup per position
and distinct stop length, and the held-back tail one binary search per
candidate length. A request with many stop strings (up to
``MAX_STOP_STRINGS``) costs each token about what one with a few does.
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
        self._set = frozenset(self.stops)
        self._sorted = tuple(sorted(self._set))
        self._lengths = sorted({len(s) for s in self._set})
        self._longest = self._lengths[-1] if self._lengths else 0
        self.include_stop = include_stop
        self.pending = ""  # received, not released: a possible stop-string start
        self.unmatched = 0  # leading characters of ``pending`` that end no stop string
        self.stopped: str | None = None  # the stop string found
        self.received = 0  # characters given to ``feed`` and ``release``
        # Where the stop string found ends, counted in the characters received.
        self.stop_end: int | None = None

    def feed(self, piece: str) -> str:
        """Add ``piece``; return the text now safe to release."""
        if self.stopped is not None or not piece:
            return ""
        self.received += len(piece)
        if not self.stops:
            return piece
        text = self.pending + piece
        held = len(text) - self._held_tail(text)  # where a stop string may still begin
        found = self._earliest(text)
        if found is not None and found[0] <= held:
            self.pending, self.unmatched = "", 0
            return self._cut(text, found)
        # A stop string found after ``held`` may yet lose to a longer one
        # that begins at ``held``: hold everything from there.
        released = self._hold_from(text, held)
        if found is None:  # no stop string ends anywhere in what is held
            self.unmatched = len(self.pending)
        return released

    def release(self, piece: str) -> str:
        """Add ``piece``, which ends no stop string (the output is still below
        its ``min_tokens``); return the text now safe to release. The tail
        that may begin a stop string is held back as ``feed`` holds it."""
        if self.stopped is not None or not piece:
            return ""
        self.received += len(piece)
        text = self.pending + piece
        released = self._hold_from(text, len(text) - self._held_tail(text))
        self.unmatched = len(self.pending)
        return released

    def _hold_from(self, text: str, held: int) -> str:
        """Keep ``text[held:]`` pending, release the rest."""
        self.unmatched = max(0, self.unmatched - held)
        self.pending = text[held:]
        return text[:held]

    def flush(self) -> str:
        """The held-back text, cut before a stop string it holds, once no more text will come."""
        text, self.pending = self.pending, ""
        if self.stopped is not None:
            return ""
        found = self._earliest(text)
        self.unmatched = 0
        if found is None:
            return text
        return self._cut(text, found)

    def _cut(self, text: str, found: tuple[int, str]) -> str:
        """``text`` up to the stop string ``found`` (its index and itself),
        which ends the output; ``text`` is the tail of what was received."""
        index, self.stopped = found
        self.stop_end = self.received - len(text) + index + len(self.stopped)
        return text[: index + len(self.stopped)] if self.include_stop else text[:index]

    def _earliest(self, text: str) -> tuple[int, str] | None:
        """(index, stop string) of the earliest stop string in ``text`` that
        ends past its first ``unmatched`` characters, the smallest string
        where two begin at one index; None if there is none."""
        found = None
        for end in range(self.unmatched + 1, len(text) + 1):
            for n in self._lengths:
                if n > end:
                    break
                if (candidate := text[end - n:end]) in self._set:
                    if found is None or (end - n, candidate) < found:
                        found = (end - n, candidate)
        return found

    def _held_tail(self, text: str) -> int:
        """Length of the longest tail of ``text`` that a stop string starts
        with (a proper start: a whole stop string there was found already)."""
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
    also releases what is held back (``flush``). ``stopped``: the stop
    string met, once met (the caller then ends the request);
    ``num_stop_tokens``: the tokens up to the end of the piece that
    completed it, the ones the output keeps. A stop string may be found
    some pieces after the one that completed it (it waited for a longer one
    that began earlier and never came), so the caller cuts its tokens to
    these, not to those it has seen. Pieces may be one token's text
    (``LLM``, the engine client) or one step's (the HTTP server)."""

    def __init__(self, stops: Sequence[str], include_stop: bool = False,
                 min_tokens: int = 0) -> None:
        self.matcher = StopStringMatcher(stops, include_stop)
        self.min_tokens = min_tokens
        self.num_tokens = 0
        # After each piece: the characters received so far, and the tokens.
        self._piece_ends: list[int] = []
        self._piece_tokens: list[int] = []

    @property
    def stopped(self) -> str | None:
        return self.matcher.stopped

    @property
    def num_stop_tokens(self) -> int | None:
        """The tokens up to the end of the piece whose text completed the
        stop string met (None until one is met)."""
        end = self.matcher.stop_end
        if end is None:
            return None
        return self._piece_tokens[bisect.bisect_left(self._piece_ends, end)]

    def add(self, piece: str, num_tokens: int, last: bool = False) -> str:
        """The text now safe to show, after ``piece`` of ``num_tokens`` more
        tokens; ``last``: no more will come."""
        self.num_tokens += num_tokens
        if self.stopped is None:
            self._piece_ends.append(self.matcher.received + len(piece))
            self._piece_tokens.append(self.num_tokens)
        if self.num_tokens <= self.min_tokens:
            text = self.matcher.release(piece)  # too early for a stop string
        else:
            text = self.matcher.feed(piece)
        if last and self.stopped is None:
            text += self.matcher.flush()  # may end at a stop string it held back
        return text
