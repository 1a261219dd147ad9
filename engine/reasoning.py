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
tags (``REASONING_PARSERS``) and, on token ids, whether a text has already
ended its thinking (``ReasoningTokens.ended_in``), which decides where a
request's structured-output grammar starts (``engine.structured_outputs``).
How an output's text splits into reasoning and answer is the server's
(``serving.http.reasoning``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

START_TAG, END_TAG = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningSyntax:
    """A parser's tags, and whether ``enable_thinking`` false in a request's
    ``chat_template_kwargs`` turns its reasoning off (``thinking_switch``)."""

    name: str
    start: str = START_TAG
    end: str = END_TAG
    thinking_switch: bool = False

    def thinking_off(self, chat_template_kwargs: Mapping[str, Any] | None) -> bool:
        """Whether a request with these ``chat_template_kwargs`` asked for
        no reasoning (vLLM's test: ``enable_thinking`` given and false)."""
        return self.thinking_switch and not (chat_template_kwargs or {}).get(
            "enable_thinking", True)


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
