"""A test hook: make one rank's step fail, to check how the system reacts.

``TPRUN_INJECT_STEP_FAULT=RANK:STEP`` makes rank RANK raise inside step
STEP, after the plan was accepted (as a bug in the model would). Unset, as it
is everywhere but in fault tests, it costs one dictionary lookup at start-up.
"""

from __future__ import annotations

import os


class InjectedFault(RuntimeError):
    """Raised by ``maybe_fail`` at the configured rank and step."""


def parse_fault(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    try:
        rank, step = (int(x) for x in value.split(":"))
    except ValueError as e:
        raise ValueError(f"TPRUN_INJECT_STEP_FAULT must be RANK:STEP, got {value!r}") from e
    return rank, step


class FaultInjector:
    def __init__(self, rank: int, environ=os.environ):
        self.target = parse_fault(environ.get("TPRUN_INJECT_STEP_FAULT"))
        self.rank = rank

    def maybe_fail(self, step_id: int) -> None:
        if self.target == (self.rank, step_id):
            raise InjectedFault(f"injected fault in rank {self.rank}, step {step_id}")
