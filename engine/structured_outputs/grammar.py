"""``Grammar``: one request's matcher, in step with the tokens it keeps.

Invariant: the matcher has consumed exactly the request's output tokens
(``num_tokens == len(request.output_token_ids)``). The scheduler advances it
with every token it appends (``accept``), and only those: a token sampled
for a step whose output is discarded (the request finished, was aborted or
preempted meanwhile) is never consumed. ``rollback_to`` brings it back to a
shorter output (a preempted request recomputes from the tokens it keeps);
since only appended tokens are consumed, that leaves the matcher as it is
(it touches the matcher only when it is ahead). While the engine's fill
thread computes a step's bitmask, llguidance holds the step's matchers:
the engine uses none of them until the fill's ``result()``.
"""

from __future__ import annotations

from typing import Any


class Grammar:
    def __init__(self, matcher: Any):
        self.matcher = matcher
        self.num_tokens = 0

    def accept(self, token: int) -> bool:
        """Consume one sampled token; False if the grammar refuses it (the
        matcher is then in its error state for good)."""
        if not self.matcher.consume_token(token):
            return False
        self.num_tokens += 1
        return True

    def rollback_to(self, num_tokens: int) -> None:
        """Forget the tokens consumed after the first ``num_tokens``."""
        extra = self.num_tokens - num_tokens
        if extra > 0:
            self.matcher.rollback(extra)
            self.num_tokens = num_tokens

    def is_terminated(self) -> bool:
        """The grammar is complete: nothing but EOS can follow."""
        return self.matcher.is_stopped()

    def is_error(self) -> bool:
        return self.matcher.is_error()

    def error(self) -> str:
        """Why the matcher refused a token, on one line: the first line of
        llguidance's message (the rest is its parser state and grammar)."""
        return self.matcher.get_error().strip().split("\n", 1)[0]
