"""A request that a stop token ends (one of ``stop_token_ids``) keeps the
token's id but not its text, as vLLM leaves it out, and names it as its
``stop_reason``; the reference is the tokenizer's own decode of the ids
before it."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

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
