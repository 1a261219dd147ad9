"""The reasoning parsers on hand-written model outputs: each text's
reasoning and content are written out by hand from vLLM's rules
(``serving/http/reasoning.py``: a start tag dropped, everything before the
first end tag reasoning, an output without one all reasoning), and the same
text fed in pieces of every size gives the same split, the pieces' parts
adding up to it. Where a request's reasoning stands when its output begins
(the engine's rule, ``engine.reasoning.Reasoning.starts_inside``) is
checked on token ids, with each parser's own rule for ``enable_thinking``
as a request's ``chat_template_kwargs`` give it."""

from __future__ import annotations

import pytest

from engine.reasoning import (
    REASONING_PARSERS,
    Reasoning,
    ReasoningTokens,
    enable_thinking_of,
    reasoning_tokens,
)
from serving.http.answer_reader import ReasonedReader
from serving.http.reasoning import ReasoningReader
from serving.http.tool_parsers import HermesReader
from tests.helpers.tool_stream import assembled

START, END = 7, 8  # tag ids of a made-up tokenizer
TOKENS = ReasoningTokens(START, END)

# (text, reasoning, content) of an output that begins inside its reasoning.
CASES = [
    ("<think>Two and two.</think>Four.", "Two and two.", "Four."),
    ("Two and two.</think>Four.", "Two and two.", "Four."),  # no start tag: DeepSeek-R1's
    ("\n<think>\nhm\n</think>\n\nFour.", "\n\nhm\n", "\n\nFour."),
    ("Still thinking", "Still thinking", None),  # cut before the end tag
    ("<think>Still", "Still", None),
    ("Done.</think>", "Done.", None),  # ended right after its reasoning
    ("</think>Four.", "", "Four."),
    ("<think></think>", "", None),
    ("", "", None),
    # Only the first start tag is dropped; after the first end tag all is content.
    ("a<think>b<think>c</think>d</think>e<think>", "ab<think>c", "d</think>e<think>"),
    ("<thin</th>a</think</think>b", "<thin</th>a</think", "b"),
    ("x < y </ z", "x < y </ z", None),
    ("2 <", "2 <", None),  # a tail that might have been a tag: reasoning once the text ends
    ("é😀</think>ü", "é😀", "ü"),
]


def _split(text: str, cuts: list[int], in_reasoning: bool = True):
    """``text`` fed in the pieces ``cuts`` makes: (reasoning, content) of
    the pieces, as the reader settles them, and the reader."""
    reader = ReasoningReader(REASONING_PARSERS["deepseek_r1"], in_reasoning)
    pieces, start = [], 0
    for end in [*cuts, len(text)]:
        pieces += reader.pieces(text[start:end], last=end == len(text))
        start = end
    reasoning = "".join(v for k, v in pieces if k == "reasoning")
    content = "".join(v for k, v in pieces if k == "content")
    return reasoning, content, reader


@pytest.mark.parametrize("text, reasoning, content", CASES)
def test_an_output_splits_as_vllm_splits_it(text, reasoning, content):
    got_reasoning, got_content, reader = _split(text, [])
    assert (got_reasoning, got_content or None) == (reasoning, content)
    assert reader.reasoning == reasoning
    message = ReasonedReader(ReasoningReader(REASONING_PARSERS["qwen3"], True), None)
    message.pieces(text, last=True)
    assert message.message() == {"content": content, "reasoning": reasoning}


@pytest.mark.parametrize("text, reasoning, content", CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_pieces_of_any_size_split_as_the_whole(text, reasoning, content, size):
    got = _split(text, list(range(size, len(text), size)))
    assert (got[0], got[1] or None) == (reasoning, content)


def test_a_possible_tag_is_held_back_until_the_text_tells():
    reader = ReasoningReader(REASONING_PARSERS["deepseek_r1"], True)
    assert reader.pieces("ab<") == [("reasoning", "ab")]
    assert reader.pieces("/th") == []
    assert reader.pieces("ink") == []
    assert reader.pieces(">\nc") == [("content", "\nc")]
    reader = ReasoningReader(REASONING_PARSERS["deepseek_r1"], True)
    assert reader.pieces("<th") == []
    assert reader.pieces("is") == [("reasoning", "<this")]  # not a tag after all
    assert reader.pieces("<think") == []
    assert reader.pieces("> x") == [("reasoning", " x")]  # a start tag, dropped
    assert reader.pieces("<", last=True) == [("reasoning", "<")]


def test_an_output_after_its_reasoning_is_all_content():
    for text, _, _ in CASES:
        reasoning, content, reader = _split(text, [1, 3], in_reasoning=False)
        assert (reasoning, content, reader.reasoning) == ("", text, None)
    message = ReasonedReader(ReasoningReader(REASONING_PARSERS["qwen3"], False), None)
    message.pieces("a</think>b", last=True)
    assert message.message() == {"content": "a</think>b", "reasoning": None}


def test_only_the_content_is_read_for_calls():
    """A call written inside the reasoning is reasoning text; the hermes
    reader sees the content alone."""
    reader = ReasonedReader(ReasoningReader(REASONING_PARSERS["deepseek_r1"], True),
                            HermesReader())
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call></think>Sure.'
            '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>')
    deltas = [reader.delta(text[i:i + 4], last=i + 4 >= len(text))
              for i in range(0, len(text), 4)]
    message = reader.message()
    assert message["reasoning"] == '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert message["content"] == "Sure."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] \
        == [("b", '{"x": 1}')]
    assert "".join(d.get("reasoning", "") for d in deltas) == message["reasoning"]
    assert "".join(d.get("content", "") for d in deltas) == "Sure."
    assert assembled([c for d in deltas for c in d.get("tool_calls", [])]) == \
        message["tool_calls"]
    assert reader.finish_reason("stop") == "tool_calls"


def test_hidden_reasoning_is_left_out_of_deltas_and_message():
    reader = ReasonedReader(ReasoningReader(REASONING_PARSERS["qwen3"], True), None,
                            shown=False)
    assert reader.delta("Hmm.</think>", last=False) == {}
    assert reader.delta("Yes.", last=True) == {"content": "Yes."}
    assert reader.message() == {"content": "Yes.", "reasoning": None}


@pytest.mark.parametrize("prompt, kwargs, deepseek_r1, qwen3", [
    ([1, 2, 3], None, True, True),  # no tag: the output opens its thinking itself, or not
    ([1, START, 2], None, True, True),  # an open thinking (DeepSeek-R1's template)
    ([1, START, 2, END, 3], None, False, False),  # a closed one (Qwen3's, thinking off)
    ([START, END, 1, START], None, True, True),  # closed in history, open again
    ([1, 2], {"enable_thinking": False}, True, False),  # qwen3's switch, as vLLM reads it
    ([1, 2], {"enable_thinking": 0}, True, False),
    ([1, 2], {"enable_thinking": True}, True, True),
    ([1, 2], {"other": False}, True, True),
])
def test_where_an_output_begins(prompt, kwargs, deepseek_r1, qwen3):
    for name, want in (("deepseek_r1", deepseek_r1), ("qwen3", qwen3)):
        reasoning = Reasoning(REASONING_PARSERS[name], TOKENS)
        assert reasoning.starts_inside(prompt, enable_thinking_of(kwargs)) is want, name


class _Vocab:
    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.vocab.get(token)


def test_a_tokenizer_without_the_tags_is_refused():
    syntax = REASONING_PARSERS["qwen3"]
    assert reasoning_tokens(syntax, _Vocab({"<think>": 5, "</think>": 9})) == \
        ReasoningTokens(5, 9)
    with pytest.raises(ValueError, match=r"needs the tokens '<think>' and '</think>' .* which "
                                         r"has no '</think>'$"):
        reasoning_tokens(syntax, _Vocab({"<think>": 5}))
