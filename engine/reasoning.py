"""Reasoning parsers: where a reasoning model's thinking ends, under vLLM's
parser names (``--reasoning-parser NAME``).

A reasoning model writes its thinking first, between a start tag and an end
tag, then its answer. The two parsers here read the same tags, ``<think>``
and ``</think>``, which the model's tokenizer must hold as single tokens
(vLLM refuses a tokenizer without them, and so does ``reasoning_tokens``):

- ``deepseek_r1`` (DeepSeek-R1 and its distills, QwQ): the output may
  begin inside the thinking without a start tag (the chat template opens
  it in the prompt); everything before the first end tag is reasoning.
- ``qwen3`` (Qwen3): the same, and a request whose
  ``chat_template_kwargs`` turn ``enable_thinking`` off (any false value,
  as vLLM reads it) has no reasoning: its whole output is the answer.

This module holds what the engine and the HTTP server share: the names and
tags (``REASONING_PARSERS``) and the one rule of where a request's output
begins (``Reasoning.starts_inside``): inside its reasoning unless its
prompt ended the thinking (``ReasoningTokens.ended_in``) or the request
turned thinking off under a parser that reads that switch. The engine
applies it once per request, where the request enters it
(``LLMEngine.new_request``); it decides where the request's
structured-output grammar starts (``engine.structured_outputs``), and every
caller learns it from the engine (``RequestAccepted.starts_in_reasoning``)
rather than working it out again. How an output's text splits into
reasoning and answer is the server's (``serving.http.reasoning``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

START_TAG, END_TAG = "<think>", "</think>"


def enable_thinking_of(chat_template_kwargs: Mapping[str, Any] | None) -> bool:
    """A request's ``enable_thinking``, as vLLM reads it in its
    ``chat_template_kwargs``: true unless given and false (any false value)."""
    return bool((chat_template_kwargs or {}).get("enable_thinking", True))


@dataclass(frozen=True)
class ReasoningSyntax:
    """A parser's tags, and whether a request's ``enable_thinking`` false
    turns its reasoning off (``thinking_switch``)."""

    name: str
    start: str = START_TAG
    end: str = END_TAG
    thinking_switch: bool = False

    def thinking_off(self, enable_thinking: bool) -> bool:
        """Whether a request with this ``enable_thinking`` has no reasoning."""
        return self.thinking_switch and not enable_thinking


REASONING_PARSERS: dict[str, ReasoningSyntax] = {
    "deepseek_r1": ReasoningSyntax("deepseek_r1"),
    "qwen3": ReasoningSyntax("qwen3", thinking_switch=True),
}


@dataclass(frozen=True)
class ReasoningTokens:
    """The ids of a parser's start and end tags in one tokenizer."""

    start_id: int
    end_id: int

    def ended_in(self, token_ids: Sequence[int]) -> bool:
        """Whether ``token_ids`` end a thinking: of the two tags, the last
        one there is the end tag (vLLM's ``is_reasoning_end``). A prompt
        for which this holds (a chat template that closed the thinking,
        as Qwen3's does with ``enable_thinking`` false) leaves no reasoning
        to the output."""
        for token in reversed(token_ids):
            if token == self.start_id:
                return False
            if token == self.end_id:
                return True
        return False


@dataclass(frozen=True)
class Reasoning:
    """The engine's reasoning parser: its syntax and its tags' ids in the
    model's tokenizer."""

    syntax: ReasoningSyntax
    tokens: ReasoningTokens

    @classmethod
    def named(cls, name: str, tokenizer) -> Reasoning:
        """The parser ``name`` (in ``REASONING_PARSERS``) over ``tokenizer``;
        ValueError when the tokenizer lacks its tags (``reasoning_tokens``)."""
        syntax = REASONING_PARSERS[name]
        return cls(syntax, reasoning_tokens(syntax, tokenizer))

    def starts_inside(self, prompt_token_ids: Sequence[int], enable_thinking: bool = True) -> bool:
        """Whether the output of a request with this prompt and this
        ``enable_thinking`` begins inside its reasoning: not where the
        prompt ended the thinking (a chat template that closed it) nor
        where the request turned it off under a parser that reads the
        switch (``qwen3``); the output is then all answer. Else it begins
        inside, with or without a start tag of its own."""
        return not (self.syntax.thinking_off(enable_thinking)
                    or self.tokens.ended_in(prompt_token_ids))


def reasoning_tokens(syntax: ReasoningSyntax, tokenizer) -> ReasoningTokens:
    """The tag ids of ``syntax`` in ``tokenizer`` (``checkpoint.tokenizer.Tokenizer``);
    ValueError when it lacks either tag as one token: its outputs could
    never end their thinking where the engine can see it."""
    ids = {tag: tokenizer.convert_tokens_to_ids(tag) for tag in (syntax.start, syntax.end)}
    missing = [tag for tag, token_id in ids.items() if token_id is None]
    if missing:
        raise ValueError(f"reasoning parser {syntax.name!r} needs the tokens "
                         f"{' and '.join(map(repr, (syntax.start, syntax.end)))} in the model's "
                         f"tokenizer, which has no {' nor '.join(map(repr, missing))}")
    return ReasoningTokens(ids[syntax.start], ids[syntax.end])
