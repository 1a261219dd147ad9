"""Per-request sampling parameters, with vLLM's names.

Invariants once constructed (``__post_init__`` raises ``ValueError``
otherwise): ``temperature >= 0`` (0 is greedy); ``0 < top_p <= 1``;
``top_k >= 0`` (0 disables it; -1 is accepted and stored as 0);
``0 <= min_p <= 1``; ``max_tokens >= 1``; ``repetition_penalty > 0``;
``-2 <= presence_penalty, frequency_penalty <= 2``; ``logprobs`` is None or
``>= 0``; ``seed`` is None or an int; ``stop_token_ids`` is a tuple of ints;
``structured_outputs`` is None or a ``StructuredOutputsParams`` (a dict is
converted; its own checks apply).
Every int fits a signed 64-bit integer, the type the messages to the engine
and the workers carry.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from engine.structured_outputs.params import StructuredOutputsParams
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
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        self._check_structured_outputs()
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

    def _check_structured_outputs(self) -> None:
        so = self.structured_outputs
        if isinstance(so, dict):
            object.__setattr__(self, "structured_outputs", StructuredOutputsParams.from_dict(so))
        elif so is not None and not isinstance(so, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams or a dict, "
                             f"got {type(so).__name__}")

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
        )


def _require_number(name: str, value: Any) -> None:
    if not _is_number(value) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
