"""The drafts a step's output reports for the next step
(``ModelRunnerOutput.next_draft_token_ids``), checked against what the
step's bitmask asked for (``GrammarBitmask.draft_req_ids``).

The engine fills the next step's grammar rows over these drafts
(``StructuredOutputManager.start_bitmask``): a request missing from the
reply would keep its drafts of the step before (its rows then follow
drafts the runner does not verify), one the bitmask did not ask for, a
list of the wrong length or an id outside the vocabulary would reach
llguidance, which fails on it deep in a fill or sends the matcher into its
error state. So a reply that breaks the contract is refused whole, with a
``ValueError`` naming what is wrong, as ``Scheduler.update_from_output``
refuses a reply of the wrong step or with the wrong rows: the worker that
sent it is not to be trusted, and the engine fails."""

from __future__ import annotations


def checked_drafts(step_id: int, reported: dict[str, list[int]], asked: list[str],
                   num_speculative_tokens: int, vocab_size: int) -> dict[str, list[int]]:
    """``reported`` when it holds exactly the requests of ``asked``, each
    with ``num_speculative_tokens`` token ids (ints in ``0 ..
    vocab_size - 1``); else ``ValueError``."""
    where = f"runner output of step {step_id}"
    unasked = sorted(set(reported) - set(asked))
    if unasked:
        raise ValueError(f"{where} reports drafts for {unasked}, which its bitmask did not "
                         f"ask for")
    missing = sorted(set(asked) - set(reported))
    if missing:
        raise ValueError(f"{where} lacks the drafts of {missing}, which its bitmask asked for")
    for req_id, drafts in reported.items():
        if type(drafts) is not list or len(drafts) != num_speculative_tokens:
            count = len(drafts) if isinstance(drafts, list) else type(drafts).__name__
            raise ValueError(f"{where} reports {count} drafts for {req_id!r}, not "
                             f"{num_speculative_tokens}")
        for token in drafts:
            if type(token) is not int or not 0 <= token < vocab_size:
                raise ValueError(f"{where} reports the draft {token!r} for {req_id!r}, "
                                 f"no token id of the vocabulary of {vocab_size}")
    return reported
