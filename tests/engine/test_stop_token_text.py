"""A request that a stop token ends (one of ``stop_token_ids``) keeps the
token's id but not its text, as vLLM leaves it out, and names it as its
``stop_reason``; the reference is the tokenizer's own decode of the ids
before it."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.outputs import RequestOutputDelta, shown_token_ids

PROMPT = "The quick brown fox jumps over"


@pytest.mark.timeout(180)
def test_a_stop_token_adds_its_id_but_not_its_text():
    with LLM(model="tiny", device="cpu") as llm:
        greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        ids = llm.generate(PROMPT, greedy)[0].outputs[0].token_ids
        # The first token not seen before it: the stop ends the output there.
        at = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
        stop = ids[at]
        out = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8,
                                                  ignore_eos=True,
                                                  stop_token_ids=[stop]))[0].outputs[0]
        tokenizer = llm.get_tokenizer()
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.token_ids == ids[:at + 1]
    assert out.text == tokenizer.decode(ids[:at])
    assert tokenizer.decode([stop])  # the stop token has text, which is left out


@pytest.mark.timeout(180)
def test_include_stop_str_in_output_shows_the_stop_token_text():
    """vLLM shows the text of the stop token (or end-of-sequence token) that
    ended the output when the request asks for
    ``include_stop_str_in_output``: the text is the tokenizer's decode of
    every id, the stop token's included (special tokens as
    ``skip_special_tokens`` says)."""
    with LLM(model="tiny", device="cpu") as llm:
        tokenizer = llm.get_tokenizer()
        ids = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8,
                                                  ignore_eos=True))[0].outputs[0].token_ids
        at = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
        stop = llm.generate(PROMPT, SamplingParams(
            temperature=0.0, max_tokens=8, ignore_eos=True, stop_token_ids=[ids[at]],
            include_stop_str_in_output=True))[0].outputs[0]
        # The end-of-sequence id, made the likeliest once min_tokens are out.
        eos = tokenizer.eos_token_id
        ended = llm.generate(PROMPT, SamplingParams(
            temperature=0.0, max_tokens=8, min_tokens=2, logit_bias={eos: 100.0},
            include_stop_str_in_output=True, skip_special_tokens=False))[0].outputs[0]
    assert (stop.finish_reason, stop.stop_reason) == ("stop", ids[at])
    assert stop.token_ids == ids[:at + 1]
    assert stop.text == tokenizer.decode(ids[:at + 1])
    assert (ended.finish_reason, ended.stop_reason) == ("stop", None)
    assert ended.token_ids[-1] == eos and len(ended.token_ids) == 3
    assert ended.text == tokenizer.decode(ended.token_ids, skip_special_tokens=False)
    assert ended.text.endswith(tokenizer.eos_token)


@pytest.mark.timeout(180)
def test_a_shown_stop_token_completes_a_stop_string():
    """With ``include_stop_str_in_output`` the stop token's text is shown,
    and vLLM checks the stop strings over it like any other text: where it
    is a stop string, that string is the reason, not the token id
    (one-letter tokens, hand-worked from the greedy ids)."""
    letters = list(range(ord("a"), ord("z") + 1))
    with LLM(model="tiny", device="cpu") as llm:
        greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                allowed_token_ids=letters)
        ids = llm.generate(PROMPT, greedy)[0].outputs[0].token_ids
        at = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
        out = llm.generate(PROMPT, greedy.replaced(
            stop_token_ids=[ids[at]], stop=[chr(ids[at])],
            include_stop_str_in_output=True))[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", chr(ids[at]))
    assert out.token_ids == ids[:at + 1]
    assert out.text == "".join(map(chr, ids[:at + 1]))


def test_the_shown_ids_leave_out_only_a_stop_token_that_ends_the_request():
    """The one rule both the LLM's final text and the server's streamed text
    use (hand-worked cases): the last id of a delta that ends on its stop
    token is not shown, whether the ids are the request's whole output or a
    piece of one step's tokens that runs to the delta's end; nothing else
    is left out."""
    stop = RequestOutputDelta("r", [7, 8, 2], finished=True, finish_reason="stop",
                              hides_stop_token=True, stop_reason=2)
    assert shown_token_ids(stop, [4, 5, 7, 8, 2], through_end=True) == [4, 5, 7, 8]
    assert shown_token_ids(stop, [2], through_end=True) == []
    assert shown_token_ids(stop, [7], through_end=False) == [7]  # a piece before the end
    length = RequestOutputDelta("r", [7, 8, 2], finished=True, finish_reason="length")
    assert shown_token_ids(length, [7, 8, 2], through_end=True) == [7, 8, 2]
    running = RequestOutputDelta("r", [7, 8], finished=False)
    assert shown_token_ids(running, [7, 8], through_end=True) == [7, 8]
