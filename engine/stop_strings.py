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
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stops: Sequence[str], include_stop: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError("a stop string must not be empty")
        self.stops = tuple(stops)
        self.include_stop = include_stop
        self.pending = ""  # received, not released: a possible stop-string start
        self.unmatched = 0  # leading characters of ``pending`` that end no stop string
        self.stopped: str | None = None  # the stop string found

    def feed(self, piece: str) -> str:
        """Add ``piece``; return the text now safe to release."""
        if self.stopped is not None or not piece:
            return ""
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
        return self._hold_from(text, held)

    def release(self, piece: str) -> str:
        """Add ``piece``, which ends no stop string (the output is still below
        its ``min_tokens``); return the text now safe to release. The tail
        that may begin a stop string is held back as ``feed`` holds it."""
        if self.stopped is not None or not piece:
            return ""
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
        which ends the output."""
        index, self.stopped = found
        return text[: index + len(self.stopped)] if self.include_stop else text[:index]

    def _earliest(self, text: str) -> tuple[int, str] | None:
        """(index, stop string) of the earliest stop string in ``text`` that
        ends past its first ``unmatched`` characters, if any."""
        found = [(i, s) for s in self.stops
                 if (i := text.find(s, max(0, self.unmatched - len(s) + 1))) >= 0]
        return min(found) if found else None

    def _held_tail(self, text: str) -> int:
        """Length of the longest tail of ``text`` that a stop string starts with."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest


class OutputStops:
    """One output's text through its ``StopStringMatcher``, piece by piece,
    with the rule of ``min_tokens``: a piece whose tokens all lie within
    the first ``min_tokens`` output tokens ends no stop string
    (``release``), later ones may (``feed``); the output's last piece
    also releases what is held back (``flush``). ``stopped``: the stop
    string met, once met (the caller then ends the request). Pieces may
    be one token's text (``LLM``) or one step's (the HTTP server, the
    engine client)."""

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
            text += self.matcher.flush()  # may end at a stop string it held back
        return text
