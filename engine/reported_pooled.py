"""The pooled vectors a pooling step's output reports
(``ModelRunnerOutput.pooled``), checked against the step's plan.

A pooling request finishes only on the step whose output carries its
vector: a request whose prompt ran to its end in the step but is missing
from the reply would never be scheduled again nor finish (its caller
waits forever); a vector for a request still mid-prompt, or for a
generating request, means the runner pooled rows the plan did not end; a
vector of another size than ``pooled_size`` float32 values would become a
wrong embedding (or fail deep in the head, after other requests of the
reply changed). So a reply that breaks the contract is refused whole, with
a ``ValueError`` naming what is wrong, as ``Scheduler.update_from_output``
refuses a reply of the wrong step or with the wrong rows."""

from __future__ import annotations

FLOAT32_BYTES = 4


def checked_pooled(step_id: int, reported: dict[str, bytes], ended: list[str],
                   pooled_size: int) -> dict[str, bytes]:
    """``reported`` when it holds exactly the requests of ``ended`` (the
    step's pooling requests whose prompt reaches its end), each with
    ``pooled_size`` float32 values (``pooled_size * 4`` bytes); else
    ``ValueError``."""
    where = f"runner output of step {step_id}"
    unended = sorted(set(reported) - set(ended))
    if unended:
        raise ValueError(f"{where} reports a pooled vector for {unended}, whose prompt does "
                         "not end in this step (or which pools nothing)")
    missing = sorted(set(ended) - set(reported))
    if missing:
        raise ValueError(f"{where} lacks the pooled vector of {missing}, whose prompt ends in "
                         "this step")
    size = pooled_size * FLOAT32_BYTES
    for req_id, vector in reported.items():
        if len(vector) != size:
            raise ValueError(f"{where} reports {len(vector)} bytes for {req_id!r}, not {size} "
                             f"({pooled_size} float32 values)")
    return reported
