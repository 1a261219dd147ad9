"""``LLM.generate``'s text of an output that ends inside a UTF-8
character: forced to "a", 0xC3 (a lone lead byte), "a", 0xC3 (``logit_bias``
favours both; ``bad_words`` ["aa"] bans an "a" after an "a"), its text is
vLLM's: the last lead byte, which vLLM's detokenizer still holds back, is
not shown; the one inside is U+FFFD. Decoded at the end (no stop strings)
and token by token (a stop string that never comes). Reference: tokenizers'
``DecodeStream`` as vLLM uses it (``tests/helpers/vllm_detokenizer.py``)
over the token ids the output holds."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.helpers.vllm_detokenizer import vllm_fast_text

A, LEAD = ord("a"), 0xC3


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TPRUN_CACHE", str(tmp_path_factory.mktemp("cache")))
    with LLM(model="tiny", device="cpu", max_model_len=64) as llm:
        yield llm
    mp.undo()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop", [[], ["never-here"]])
@pytest.mark.parametrize("max_tokens, want", [(4, "a\ufffda"), (5, "a\ufffda\ufffda"),
                                              (1, "a"), (2, "a")])
def test_an_incomplete_character_at_the_end_is_not_shown(llm, stop, max_tokens, want):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            logit_bias={A: 100.0, LEAD: 50.0}, bad_words=["aa"], stop=stop)
    [out] = llm.generate("x", params)
    ids = out.outputs[0].token_ids
    assert ids == [A, LEAD, A, LEAD, A][:max_tokens]
    tokenizer = llm.get_tokenizer()
    assert vllm_fast_text(tokenizer.hf, out.prompt_token_ids, ids) == want
    assert out.outputs[0].text == want
    assert tokenizer.decode(ids).endswith("\ufffd") == (max_tokens % 2 == 0)


@pytest.mark.timeout(300)
def test_lead_bytes_alone_show_nothing(llm):
    [out] = llm.generate("x", SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True,
                                             allowed_token_ids=[LEAD]))
    assert out.outputs[0].token_ids == [LEAD] * 3
    assert out.outputs[0].text == "" == vllm_fast_text(llm.get_tokenizer().hf,
                                                       out.prompt_token_ids, [LEAD] * 3)
