"""How a chat or Responses request's answers are read into messages: its
tool choice's reader (``tools.py``) and, where the server has a reasoning
parser (``reasoning.py``), the reasoning first.

``Reading.reader`` makes one choice's reader: None for a plain answer (its
text is its content), the tool choice's ``ToolCallReader``, or, with a
reasoning parser, a ``ReasonedReader`` over both, told by the engine whether the output
begins inside its reasoning. As vLLM reads a
reasoning model's answer, the reasoning is split off first and only the
rest, the content, goes to the tool-call reader, so text inside the
reasoning never becomes a call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checkpoint.growing_text import GrowingText
from serving.http.reasoning import ReasoningCount, ReasoningParser, ReasoningReader
from serving.http.tools import ToolCallReader, ToolChoice, delta_of


@dataclass(frozen=True)
class Reading:
    """A request's way of reading its answers: its ``tools`` choice and,
    where the server has a ``reasoning`` parser, whether the answer shows
    the reasoning (vLLM's ``include_reasoning``). Whether an output begins
    inside its reasoning (``in_reasoning``) is the engine's word for each
    choice (``Generation.starts_in_reasoning``)."""

    tools: ToolChoice
    reasoning: ReasoningParser | None = None
    include_reasoning: bool = True

    def reader(self, in_reasoning: bool) -> ToolCallReader | ReasonedReader | None:
        """A fresh reader of one choice's text (None: a plain answer)."""
        calls = self.tools.reader()
        if self.reasoning is None:
            return calls
        return ReasonedReader(self.reasoning.reader(in_reasoning), calls,
                              self.include_reasoning)

    def reasoning_count(self, in_reasoning: bool) -> ReasoningCount | None:
        """A fresh count of one choice's reasoning tokens (None: no parser)."""
        return None if self.reasoning is None else self.reasoning.count(in_reasoning)

    def items_reader(self, in_reasoning: bool) -> ToolCallReader | ReasonedReader | None:
        """``reader`` for a Responses answer, which has no field for a
        reasoning it does not have: one that begins after its reasoning is
        read as without a parser."""
        return self.reader(True) if in_reasoning else self.tools.reader()

    @property
    def hides_reasoning(self) -> bool:
        """The answer leaves out reasoning it has: then, as vLLM serves it,
        the tokens' logprobs are left out too (they would show it)."""
        return self.reasoning is not None and not self.include_reasoning


class ReasonedReader:
    """A reasoning model's answer: ``pieces`` gives ("reasoning", text)
    pieces (none where the reasoning is not shown), then the content's
    pieces as the tool-call reader (``calls``) makes them, ("content",
    text) and ("call", entry), or the content as it is without one. The
    message (``message``) has vLLM's ``reasoning`` field: the reasoning
    text, or None for an answer without (its output began after its
    reasoning) or that does not show it. An answer with reasoning and
    nothing after it (cut inside its reasoning, or ended right after it)
    has content None, as vLLM's, unless calls were made. Without a
    tool-call reader the content is kept as its pieces (``said``), joined
    in the message, so that a long answer costs its length."""

    def __init__(self, thinking: ReasoningReader, calls: ToolCallReader | None,
                 shown: bool = True) -> None:
        self.thinking = thinking
        self.calls = calls
        self.shown = shown
        self.said = GrowingText()  # the content, without a tool-call reader

    def pieces(self, text: str, last: bool = False) -> list[tuple[str, Any]]:
        split = self.thinking.pieces(text, last)
        said = [piece for piece in split if piece[0] == "reasoning" and self.shown]
        content = "".join(value for kind, value in split if kind == "content")
        if self.calls is not None:
            return said + (self.calls.pieces(content, last) if content or last else [])
        self.said.add(content)
        return said + ([("content", content)] if content else [])

    def delta(self, text: str, last: bool = False) -> dict:
        """A chat stream's delta: ``reasoning`` first, then ``content`` and
        ``tool_calls`` (no key for what the text lets out none of)."""
        pieces = self.pieces(text, last)
        reasoning = "".join(value for kind, value in pieces if kind == "reasoning")
        return {**({"reasoning": reasoning} if reasoning else {}), **delta_of(pieces)}

    def message(self) -> dict:
        message = {"content": str(self.said)} if self.calls is None else self.calls.message()
        reasoning = self.thinking.reasoning
        if reasoning is not None and message["content"] == "" and not message.get("tool_calls"):
            message["content"] = None
        message["reasoning"] = reasoning if self.shown else None
        return message

    def finish_reason(self, reason: str | None) -> str | None:
        return reason if self.calls is None else self.calls.finish_reason(reason)
