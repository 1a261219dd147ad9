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

Cost per token: for each pattern size L, from the smallest up while
``L * min_count`` tokens are out, the last L tokens are compared with the
``min_count - 1`` copies before them, stopping at the first difference;
a non-repeating tail is usually rejected on its first comparison, so a
token pays about one comparison a size, in Python on the scheduler's
thread: microseconds for small patterns, milliseconds for a request that
asks for sizes in the tens of thousands over a long output. No pass over
the whole output.

This server's limits bound that work: ``max_pattern_size`` at most 65536,
``min_count`` at most 1000, and ``max_pattern_size * min_count`` at most
ten times the largest pattern size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ipc.errors import InvalidRequestError

MAX_PATTERN_SIZE = 65536
MAX_MIN_COUNT = 1000
MAX_SCAN_WORK = MAX_PATTERN_SIZE * 10
STOP_REASON = "repetition_detected"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class RepetitionDetectionParams(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM's parameters. ``max_pattern_size`` 0 (the default) detects
    nothing; ``min_pattern_size`` 0 reads as 1. Invariants once built:
    every field an int >= 0, ``min_pattern_size <= max_pattern_size``, and
    where detection is on, ``min_count >= 2`` and the limits above hold
    (``InvalidRequestError`` naming ``repetition_detection`` otherwise)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            value = getattr(self, name)
            if not _is_int(value):
                raise _error(f"{name} must be an int, got {value!r}")
        if (self.max_pattern_size < 0 or self.min_pattern_size < 0
                or self.min_pattern_size > self.max_pattern_size):
            raise _error("max_pattern_size and min_pattern_size must be >= 0, with "
                         "min_pattern_size <= max_pattern_size (both 0: no detection); got "
                         f"{self.min_pattern_size} and {self.max_pattern_size}")
        if self.max_pattern_size > MAX_PATTERN_SIZE:
            raise _error(f"max_pattern_size must be at most {MAX_PATTERN_SIZE}, "
                         f"got {self.max_pattern_size}")
        if self.min_count > MAX_MIN_COUNT:
            raise _error(f"min_count must be at most {MAX_MIN_COUNT}, got {self.min_count}")
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise _error("min_count must be >= 2 to detect a repeated pattern, got "
                         f"{self.min_count}; max_pattern_size 0 turns detection off")
        if self.max_pattern_size * self.min_count > MAX_SCAN_WORK:
            raise _error(f"max_pattern_size * min_count = "
                         f"{self.max_pattern_size * self.min_count} is more than the scan "
                         f"budget of {MAX_SCAN_WORK}; lower either")

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


def ends_in_repetition(token_ids: Sequence[int], params: RepetitionDetectionParams) -> bool:
    """Whether ``token_ids`` end in ``params.min_count`` consecutive copies
    of one pattern whose size lies in [``min_pattern_size`` (0: 1),
    ``max_pattern_size``]."""
    if not params.enabled:
        return False
    count = params.min_count
    for size in range(max(params.min_pattern_size, 1), params.max_pattern_size + 1):
        if size * count > len(token_ids):
            return False  # larger sizes need even more tokens
        if _tail_repeats(token_ids, size, count):
            return True
    return False


def _tail_repeats(token_ids: Sequence[int], size: int, count: int) -> bool:
    """The last ``size`` tokens equal each of the ``count - 1`` blocks of
    ``size`` before them (``len(token_ids) >= size * count``)."""
    end = len(token_ids)
    for offset in range(1, size + 1):
        token = token_ids[end - offset]
        for copy in range(1, count):
            if token_ids[end - copy * size - offset] != token:
                return False
    return True
