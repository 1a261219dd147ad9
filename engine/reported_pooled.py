"""The pooled rows a pooling step's output reports
(``ModelRunnerOutput.pooled``), checked against the step's plan.

A sequence pooling request ("embed", "classify") is reported once, on the
step that runs the end of its prompt, with one row; a token-level request
("token_embed", "token_classify") on every step that runs a chunk of its
prompt, with one row per token of that chunk. A pooling request finishes
only on the step that runs the end of its prompt: a request missing from
the reply would never be scheduled again nor finish (its caller waits
forever), or would lack a chunk's rows; rows for a sequence request still
mid-prompt, or for a generating request, mean the runner pooled rows the
plan did not end; rows of another size than ``pooled_size`` float32 values
each, or another count than the plan gave the request, would become a
wrong output (or fail deep in the head, after other requests of the reply
changed). So a reply that breaks the contract is refused whole, with a
``ValueError`` naming what is wrong, as ``Scheduler.update_from_output``
refuses a reply of the wrong step or with the wrong rows."""

from __future__ import annotations

FLOAT32_BYTES = 4


def checked_pooled(step_id: int, reported: dict[str, bytes], expected: dict[str, int],
                   pooled_size: int) -> dict[str, bytes]:
    """``reported`` when it holds exactly the requests of ``expected`` (the
    step's pooling requests that report: a sequence request whose prompt
    ends in this step, a token-level request scheduled in it), each with
    its number of rows (1; its tokens of this step) of ``pooled_size``
    float32 values (``pooled_size * 4`` bytes a row); else ``ValueError``."""
    where = f"runner output of step {step_id}"
    unended = sorted(set(reported) - set(expected))
    if unended:
        raise ValueError(f"{where} reports a pooled vector for {unended}, whose prompt does "
                         "not end in this step (or which pools nothing)")
    missing = sorted(set(expected) - set(reported))
    if missing:
        raise ValueError(f"{where} lacks the pooled vector of {missing}, whose prompt ends in "
                         "this step (or which pools every token)")
    for req_id, vector in reported.items():
        rows = expected[req_id]
        size = rows * pooled_size * FLOAT32_BYTES
        if len(vector) != size:
            shape = f"{pooled_size}" if rows == 1 else f"{rows} rows of {pooled_size}"
            raise ValueError(f"{where} reports {len(vector)} bytes for {req_id!r}, not {size} "
                             f"({shape} float32 values)")
    return reported
