"""Repetition detection: end an output whose last tokens repeat one N-gram.

vLLM's ``repetition_detection``: an output ends with finish reason
"repetition" (``stop_reason`` "repetition_detected") once its generated
tokens end in ``min_count`` back-to-back copies of one pattern of
``min_pattern_size`` to ``max_pattern_size`` tokens. Only the output is
read (never the prompt), and only its tail: the check runs after each
appended token, so a repetition is caught on the token that completes it.
It runs where the other stop conditions are checked and after them
(``Scheduler._stop_status``): a stop token or a length limit met by the
same token wins, and an output below ``min_tokens`` is not checked.

How it is checked (``RepetitionDetector``, one per request, fed every
output token): the last ``c * L`` tokens are ``c`` copies of one pattern of
L tokens exactly when each of their last ``(c - 1) * L`` tokens equals the
token L before it. So the detector keeps, per pattern size L, the run at
L: how many tokens in a row at the end of the output equal the token L
before them; a new token extends it where it equals the token L back and
ends it otherwise, and the output repeats once some run reaches ``(c - 1)
* L``. Sizes below ``GRAM`` (4) are followed one by one. A larger size
needs a run of at least L >= ``GRAM`` to count, so only the sizes whose run
is ``GRAM`` or more are kept: those where the output's last ``GRAM``
tokens stood L tokens earlier too. An index from each ``GRAM``-gram to its
latest end, and from each end to the one before with the same gram, lists
exactly those, newest first. Of them only sizes an output of n tokens can
hold ``c`` copies of are followed (L <= n // c, and at most
``max_pattern_size``), as vLLM's check looks at no larger size: a size
that comes into that range (one every ``c`` tokens at most) has its run
counted there, by comparing tokens back from the end until one differs or
the run is long enough. A token costs a few steps plus one per earlier
copy of its last ``GRAM`` tokens within the last ``min(n // c,
max_pattern_size)`` (rare outside repetitive text), and, once every ``c``
tokens at most, one such count of at most ``(c - 1) * L`` comparisons (so
under L a token on average, where vLLM's check compares at least once per
size up to L), with no pass over the output; the verdicts are those of
comparing every size's blocks. The detector holds about two ints per output token
and one dictionary entry per distinct gram among the last ``2 * max(GRAM,
min(n // c, max_pattern_size))`` tokens at most: grams last seen before the
followed window are dropped every window's length of tokens (that window
only moves forward, so nothing dropped is read again).

This server bounds ``max_pattern_size`` at 65536 (vLLM sets no upper
bound): the window, and so the earlier copies one token's check may visit.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

import msgspec

from ipc.errors import InvalidRequestError

MAX_PATTERN_SIZE = 65536
GRAM = 4  # tokens of the grams the detector indexes its larger sizes by
STOP_REASON = "repetition_detected"
_INT64_MAX = (1 << 63) - 1


def _is_int(value: Any) -> bool:
    """An int (not a bool) that fits a signed 64-bit integer, as the
    messages carry it."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and -_INT64_MAX - 1 <= value <= _INT64_MAX)


class RepetitionDetectionParams(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM's parameters. ``max_pattern_size`` 0 (the default) detects
    nothing; ``min_pattern_size`` 0 reads as 1. Invariants once built:
    every field an int >= 0 (a signed 64-bit one), ``min_pattern_size <=
    max_pattern_size <= MAX_PATTERN_SIZE``, and where detection is on,
    ``min_count >= 2`` (``InvalidRequestError`` naming
    ``repetition_detection`` otherwise)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            value = getattr(self, name)
            if not _is_int(value):
                raise _error(f"{name} must be an int (64-bit), got {value!r}")
        if (self.max_pattern_size < 0 or self.min_pattern_size < 0
                or self.min_pattern_size > self.max_pattern_size):
            raise _error("max_pattern_size and min_pattern_size must be >= 0, with "
                         "min_pattern_size <= max_pattern_size (both 0: no detection); got "
                         f"{self.min_pattern_size} and {self.max_pattern_size}")
        if self.max_pattern_size > MAX_PATTERN_SIZE:
            raise _error(f"max_pattern_size must be at most {MAX_PATTERN_SIZE}, "
                         f"got {self.max_pattern_size}")
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise _error("min_count must be >= 2 to detect a repeated pattern, got "
                         f"{self.min_count}; max_pattern_size 0 turns detection off")

    @classmethod
    def from_value(cls, value: Any) -> RepetitionDetectionParams:
        """From these parameters or a mapping of them (vLLM's JSON object);
        unknown keys are refused by name."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise _error(f"repetition_detection must be an object, got {type(value).__name__}")
        known = set(cls.__struct_fields__)
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise _error(f"unknown repetition_detection field(s): {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
        return cls(**value)

    def to_dict(self) -> dict[str, int]:
        return msgspec.structs.asdict(self)

    @property
    def enabled(self) -> bool:
        return self.max_pattern_size > 0


def _error(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param="repetition_detection")


class RepetitionDetector:
    """One output's repetition check (``params`` with detection on), fed
    its tokens in order (``append``).

    Invariants, after the tokens t[0..n-1] appended so far (``tokens``),
    with run(L) the largest r such that t[n-j] == t[n-j-L] for j = 1..r:
    ``small_runs[i]`` is run(``small_sizes[i]``), the sizes in range below
    ``GRAM``; ``limit`` is min(``max_pattern_size``, n // ``min_count``),
    and ``runs`` maps each size L in range, ``GRAM`` or more, up to
    ``limit``, with run(L) >= ``GRAM`` to run(L), or to at least
    ``(min_count - 1) * L`` where run(L) is that much (all a verdict reads;
    every other such size has a run below ``GRAM``, too short to count: it
    would need ``(min_count - 1) * L``; a larger size cannot hold
    ``min_count`` copies yet);
    ``latest[g]`` is the last end e (index of its last token) of gram g =
    t[e-GRAM+1..e] among ends within the window (others may have been
    dropped), and ``earlier[e]`` the end before e with the same gram (-1:
    none). ``repeating``: some run(L) >= ``(min_count - 1) * L``, that is
    the output ends in ``min_count`` copies of a pattern of L tokens."""

    def __init__(self, params: RepetitionDetectionParams) -> None:
        smallest = max(params.min_pattern_size, 1)
        self.largest = params.max_pattern_size
        self.count = params.min_count
        self.copies_before = params.min_count - 1
        # The largest size followed, min(largest, n // count); the grams
        # start at token GRAM - 1, so this is its value there (below GRAM).
        self.limit = min(self.largest, (GRAM - 1) // self.count)
        self.small_sizes = list(range(smallest, min(GRAM - 1, self.largest) + 1))
        self.small_runs = [0] * len(self.small_sizes)
        self.first_large = max(smallest, GRAM)
        self.tokens: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}
        self.earlier = array("q")
        self.runs: dict[int, int] = {}
        self.repeating = False

    def append(self, token: int) -> bool:
        """Take the output's next token; whether the output now ends in a
        repetition (``repeating``)."""
        tokens, n = self.tokens, len(self.tokens)
        tokens.append(token)
        repeating = self._follow_small_sizes(token, n)
        if self.first_large > self.largest:
            pass  # no size of GRAM or more in range: no grams to index
        elif n < GRAM - 1:
            self.earlier.append(-1)
        else:
            repeating = self._follow_large_sizes(n) or repeating
        self.repeating = repeating
        return repeating

    def _follow_small_sizes(self, token: int, n: int) -> bool:
        runs, repeating = self.small_runs, False
        for i, size in enumerate(self.small_sizes):
            if size <= n and self.tokens[n - size] == token:
                runs[i] += 1
                repeating = repeating or runs[i] >= self.copies_before * size
            else:
                runs[i] = 0
        return repeating

    def _follow_large_sizes(self, n: int) -> bool:
        """The runs of the sizes up to ``limit(n)`` whose gram matches the one
        ending at n: one kept at n - 1 goes on by one, a new one starts at
        ``GRAM``, and the size that has just come into range is counted."""
        gram = tuple(self.tokens[n - GRAM + 1:])
        end = self.latest.get(gram, -1)
        self.latest[gram] = n
        self.earlier.append(end)
        period = max(self.limit, GRAM)
        if n % period == 0:  # drop grams last seen before the followed window
            self.latest = {g: e for g, e in self.latest.items() if e >= n - self.limit}
        entering = 0
        if (n + 1) % self.count == 0 and self.limit < self.largest:
            self.limit = entering = self.limit + 1
        old, runs, repeating = self.runs, {}, False
        oldest = n - self.limit
        while end >= oldest and end >= 0:  # newest first: sizes from the smallest up
            size = n - end
            if size >= self.first_large:
                run = self._run(size, n) if size == entering else old.get(size, GRAM - 1) + 1
                runs[size] = run
                repeating = repeating or run >= self.copies_before * size
            end = self.earlier[end]
        self.runs = runs
        return repeating

    def _run(self, size: int, n: int) -> int:
        """run(``size``) after token n, counted back from the end, or
        ``(min_count - 1) * size`` where it is at least that (all a verdict
        needs)."""
        tokens, need, run = self.tokens, self.copies_before * size, 0
        while run < need and run + size <= n and tokens[n - run] == tokens[n - run - size]:
            run += 1
        return run


def ends_in_repetition(token_ids: Iterable[int], params: RepetitionDetectionParams) -> bool:
    """Whether ``token_ids`` end in ``params.min_count`` consecutive copies
    of one pattern whose size lies in [``min_pattern_size`` (0: 1),
    ``max_pattern_size``]: a fresh detector fed all of them (a request
    keeps its own and feeds it one token at a time)."""
    if not params.enabled:
        return False
    detector = RepetitionDetector(params)
    for token in token_ids:
        detector.append(token)
    return detector.repeating
