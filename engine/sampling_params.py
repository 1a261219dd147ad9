"""Per-request sampling parameters, with vLLM's names.

Invariants once constructed (``__post_init__`` raises ``ValueError``
otherwise): ``temperature >= 0`` (0 is greedy); ``0 < top_p <= 1``;
``top_k >= 0`` (0 disables it; -1 is accepted and stored as 0);
``0 <= min_p <= 1``; ``max_tokens >= 1``; ``repetition_penalty > 0``;
``-2 <= presence_penalty, frequency_penalty <= 2``; ``logprobs`` and
``prompt_logprobs`` are None or ``>= 0``; ``0 <= min_tokens <= max_tokens``;
``seed`` is None or an int; ``stop_token_ids`` is a tuple of ints.
Every int fits a signed 64-bit integer, the type the messages to the engine
and the workers carry.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ipc.messages import SamplingOptions

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _is_int(value: Any) -> bool:
    """An int (not a bool) that fits a signed 64-bit integer."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and _INT64_MIN <= value <= _INT64_MAX)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's tokens and when to stop."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] | list[int] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        self._check_filters()
        self._check_limits()
        self._check_penalties()
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    def _check_filters(self) -> None:
        _require_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        _require_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k):
            raise ValueError(f"top_k must be a 64-bit int, got {self.top_k!r}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be >= 0 (0 or -1 = disabled), got {self.top_k}")
        _require_number("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be None or a 64-bit int, got {self.seed!r}")

    def _check_limits(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if isinstance(self.stop_token_ids, (str, bytes)):
            raise ValueError("stop_token_ids must be a list of ints, got a string")
        try:
            stop_ids = list(self.stop_token_ids)
        except TypeError:
            raise ValueError(
                f"stop_token_ids must be a list of ints, got {self.stop_token_ids!r}"
            ) from None
        bad = [t for t in stop_ids if not _is_int(t) or t < 0]
        if bad:
            raise ValueError(f"stop_token_ids must be non-negative ints, got {bad!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            raise ValueError(f"logprobs must be None or an int >= 0, got {self.logprobs!r}")
        if self.prompt_logprobs is not None and (not _is_int(self.prompt_logprobs)
                                                 or self.prompt_logprobs < 0):
            raise ValueError(
                f"prompt_logprobs must be None or an int >= 0, got {self.prompt_logprobs!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], "
                             f"got {self.min_tokens!r}")

    def _check_penalties(self) -> None:
        _require_number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(
                f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require_number(name, value)
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2] (0 = off), got {value}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        """Build from a plain mapping; unknown keys raise ``ValueError``
        naming them (rather than the dataclass's ``TypeError``)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown sampling parameter(s): {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        return cls(**d)

    def to_options(self) -> SamplingOptions:
        """The part of these parameters the runner needs, as an IPC message."""
        return SamplingOptions(
            temperature=float(self.temperature),
            top_k=self.top_k,
            top_p=float(self.top_p),
            min_p=float(self.min_p),
            seed=self.seed,
            repetition_penalty=float(self.repetition_penalty),
            presence_penalty=float(self.presence_penalty),
            frequency_penalty=float(self.frequency_penalty),
            logprobs=self.logprobs,
            min_tokens=self.min_tokens,
            prompt_logprobs=self.prompt_logprobs,
        )


def _require_number(name: str, value: Any) -> None:
    if not _is_number(value) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
