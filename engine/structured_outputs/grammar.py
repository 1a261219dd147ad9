"""``Grammar``: one request's matcher, in step with the tokens it keeps.

Invariant: the matcher has consumed exactly the request's output tokens
from ``start`` on (``num_tokens == len(request.output_token_ids)``, the
matcher holding the last ``num_tokens - start``). ``start`` is 0 for a
plain constraint. Under a reasoning parser (``engine.reasoning``) a request
whose output begins inside its reasoning starts unconstrained (``start``
None, vLLM's ``reasoning_ended`` false): its tokens pass the grammar by,
and the first one that is the parser's end tag ends the reasoning, the
grammar holding from the token after it (the tag itself is not the
grammar's, as in vLLM). The scheduler advances it with every token it
appends (``accept``), and only those: a token sampled for a step whose
output is discarded (the request finished, was aborted or preempted
meanwhile) is never consumed. ``rollback_to`` brings it back to a shorter
output (a preempted request recomputes from the tokens it keeps); since
only appended tokens are consumed, that leaves the matcher as it is (it
touches the matcher only when it is ahead; one rolled back over its
reasoning's end is in the reasoning again). While the engine's fill thread
computes a step's bitmask, llguidance holds the step's matchers: the
engine uses none of them until the fill's ``result()``.
"""

from __future__ import annotations

from typing import Any


class Grammar:
    def __init__(self, matcher: Any, reasoning_end_id: int | None = None):
        """``reasoning_end_id``: the end tag of a reasoning the output
        begins inside (None: constrained from its first token)."""
        self.matcher = matcher
        self.reasoning_end_id = reasoning_end_id
        self.num_tokens = 0
        self.start: int | None = 0 if reasoning_end_id is None else None

    @property
    def active(self) -> bool:
        """Whether the grammar holds the next token (not inside the reasoning)."""
        return self.start is not None

    def accept(self, token: int) -> bool:
        """Consume one sampled token; False if the grammar refuses it (the
        matcher is then in its error state for good). Inside the reasoning
        every token passes, the end tag ending it."""
        if self.start is None:
            self.num_tokens += 1
            if token == self.reasoning_end_id:
                self.start = self.num_tokens
            return True
        if not self.matcher.consume_token(token):
            return False
        self.num_tokens += 1
        return True

    def rollback_to(self, num_tokens: int) -> None:
        """Forget the tokens consumed after the first ``num_tokens``."""
        if num_tokens >= self.num_tokens:
            return
        if self.start is not None:
            extra = self.num_tokens - max(num_tokens, self.start)
            if extra > 0:
                self.matcher.rollback(extra)
            if num_tokens < self.start:
                self.start = None
        self.num_tokens = num_tokens

    def constrains(self) -> bool:
        """Whether the step's bitmask row is this grammar's: it holds the
        next token and is not complete."""
        return self.active and not self.is_terminated()

    def is_terminated(self) -> bool:
        """The grammar is complete: nothing but EOS can follow."""
        return self.active and self.matcher.is_stopped()

    def is_error(self) -> bool:
        return self.matcher.is_error()

    def error(self) -> str:
        """Why the matcher refused a token, on one line: the first line of
        llguidance's message (the rest is its parser state and grammar)."""
        return self.matcher.get_error().strip().split("\n", 1)[0]
