"""A reasoning model's output split into its reasoning and its answer, as
vLLM's reasoning parsers split it (``--reasoning-parser NAME``, the names
and tags of ``engine.reasoning``).

Where a request's reasoning stands when its output begins is the engine's
word (``engine.reasoning.Reasoning.starts_inside``, told with each
request's acceptance: ``RequestAccepted.starts_in_reasoning``); the server
sends the request's ``enable_thinking`` and reads the answer as told.

Then (``ReasoningReader``), on the output's text: a start tag before the
end tag is dropped (the first one only); everything before the first end
tag is reasoning, everything after it the answer (later tags included, as
text). An output without an end tag is all reasoning: the model was cut
before it answered. These are vLLM's rules for a whole answer; streamed,
the same text goes out in the same parts (a tail that may be the start of
a tag is held back until the next text tells), so a stream's pieces joined
are the whole answer's, which vLLM's two paths do not always agree on.

The tags are read in the text, so they must show there: a tokenizer that
holds them as special tokens drops them from text under
``skip_special_tokens`` (vLLM's parsers read the same text).
"""

from __future__ import annotations

from collections.abc import Sequence

from checkpoint.growing_text import GrowingText
from engine.reasoning import REASONING_PARSERS, ReasoningSyntax, ReasoningTokens, reasoning_tokens


class ReasoningParser:
    """The server's parser: its tags, and their ids in the model's tokenizer."""

    def __init__(self, syntax: ReasoningSyntax, tokens: ReasoningTokens) -> None:
        self.syntax = syntax
        self.tokens = tokens

    @classmethod
    def named(cls, name: str, tokenizer) -> ReasoningParser:
        """The parser ``name`` (in ``REASONING_PARSERS``) over ``tokenizer``;
        ValueError when the tokenizer lacks its tags."""
        syntax = REASONING_PARSERS[name]
        return cls(syntax, reasoning_tokens(syntax, tokenizer))

    def reader(self, in_reasoning: bool) -> ReasoningReader:
        return ReasoningReader(self.syntax, in_reasoning)

    def count(self, in_reasoning: bool) -> ReasoningCount:
        return ReasoningCount(self.tokens, in_reasoning)

    def answer_tokens(self, in_reasoning: bool) -> AnswerTokens:
        return AnswerTokens(self.tokens, in_reasoning)


class ReasoningCount:
    """The reasoning tokens of one choice's output, on token ids as they
    come (``add``): for an output that begins inside its reasoning, its
    tokens before the first end tag, tags not counted; none for one that
    begins after it. vLLM's ``completion_tokens_details.reasoning_tokens``."""

    def __init__(self, tokens: ReasoningTokens, in_reasoning: bool) -> None:
        self.tokens = tokens
        self.open = in_reasoning
        self.count = 0

    def add(self, token_ids: Sequence[int]) -> None:
        for token in token_ids:
            if not self.open:
                return
            if token == self.tokens.end_id:
                self.open = False
            elif token != self.tokens.start_id:
                self.count += 1


class AnswerTokens:
    """Which of one choice's output tokens are its answer's, on token ids
    as they come (``answer_from``): for an output that begins inside its
    reasoning, the tokens after its first end tag (the tag and the tokens
    before it are the reasoning's); every token of one that begins after
    it. The token rule of ``ReasoningCount``, and of vLLM's streamed
    Responses answer, whose reasoning deltas carry no logprobs and whose
    text deltas carry those of the tokens after the end tag."""

    def __init__(self, tokens: ReasoningTokens, in_reasoning: bool) -> None:
        self.end_id = tokens.end_id
        self.open = in_reasoning

    def answer_from(self, token_ids: Sequence[int]) -> int:
        """The index of the first answer token in ``token_ids`` (the next
        tokens of the output); ``len(token_ids)`` where none is."""
        if not self.open:
            return 0
        for i, token in enumerate(token_ids):
            if token == self.end_id:
                self.open = False
                return i + 1
        return len(token_ids)


class ReasoningReader:
    """One choice's output text as it comes: ``pieces`` gives what each new
    text settles, ("reasoning", text) pieces then ("content", text) ones;
    ``reasoning`` is all the reasoning so far (None for an output that
    began after its reasoning, whose text is all content).

    States: inside the reasoning (``in_reasoning``; ``start_seen`` once a
    start tag was dropped), then the answer. ``held`` is the text not yet
    settled inside the reasoning: a tail that may be the start of a tag,
    shorter than a tag between pieces. The reasoning is kept as
    its pieces (``thought``), joined where it is asked for: a long
    reasoning costs its length, not the square of it."""

    def __init__(self, syntax: ReasoningSyntax, in_reasoning: bool) -> None:
        self.syntax = syntax
        self.in_reasoning = in_reasoning
        self.thought: GrowingText | None = GrowingText() if in_reasoning else None
        self.start_seen = False
        self.held = ""

    @property
    def reasoning(self) -> str | None:
        return None if self.thought is None else str(self.thought)

    def pieces(self, text: str, last: bool = False) -> list[tuple[str, str]]:
        if not self.in_reasoning:
            return [("content", text)] if text else []
        self.held += text
        said: list[tuple[str, str]] = []
        while self.in_reasoning:
            end = self.held.find(self.syntax.end)
            start = -1 if self.start_seen else self.held.find(self.syntax.start)
            if start >= 0 and (end < 0 or start < end):
                self._think(self.held[:start], said)
                self.held, self.start_seen = self.held[start + len(self.syntax.start):], True
            elif end >= 0:
                self._think(self.held[:end], said)
                rest, self.held, self.in_reasoning = self.held[end + len(self.syntax.end):], "", False
                if rest:
                    said.append(("content", rest))
            else:
                tags = (self.syntax.end,) if self.start_seen else (self.syntax.start,
                                                                   self.syntax.end)
                keep = 0 if last else max(_tag_start_at_end(self.held, tag) for tag in tags)
                self._think(self.held[:len(self.held) - keep], said)
                self.held = self.held[len(self.held) - keep:]
                break
        return said

    def _think(self, text: str, said: list[tuple[str, str]]) -> None:
        if text:
            self.thought.add(text)
            said.append(("reasoning", text))


def _tag_start_at_end(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may be the start of ``tag``
    (its longest proper prefix there)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[len(text) - size:]):
            return size
    return 0
