"""``spaces_between_special_tokens`` in an output's text, whole
(``output_text``) and token by token (``IncrementalDetokenizer``): with a
decoder that spaces tokens apart (WordPiece's), against a hand-worked text,
transformers' decode and vLLM's fast detokenizer written out
(``tests.helpers.vllm_detokenizer.vllm_fast_text``); with the byte-level ``tiny``
tokenizer, whose decoder writes no spaces, the text is transformers' decode
either way."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint.tokenizer import IncrementalDetokenizer, Tokenizer, output_text
from tests.helpers.vllm_detokenizer import vllm_fast_text
from tests.helpers.wordpiece import CLS, SEP, WP_VOCAB_SIZE, WP_WORDS, X
from tests.helpers.wordpiece import wordpiece_tokenizer as _wordpiece_hf

THE, CAT, SAT, ON, MAT, S = (WP_WORDS.index(w) for w in ("the", "cat", "sat", "on", "mat", "##s"))


@pytest.fixture(scope="module")
def wordpiece() -> Tokenizer:
    return Tokenizer(_wordpiece_hf(), CLS, SEP)


def _pieces(tokenizer: Tokenizer, prompt: list[int], output: list[int], skip: bool,
            spaces: bool, cuts: list[int] = ()) -> str:
    """The detokenizer's pieces of ``output`` fed in parts of ``cuts``
    tokens (then the rest), joined."""
    detok = IncrementalDetokenizer(tokenizer, prompt, skip, spaces)
    shown, start = "", 0
    for size in cuts:
        shown += detok.feed(output[start:start + size])
        start += size
    shown += detok.feed(output[start:])
    assert shown == detok.output_text
    return shown


def test_added_tokens_in_a_row_are_written_bare_hand_worked(wordpiece):
    """The WordPiece decoder writes " " before each token but a "##" one:
    after "[CLS] the cat", the output "sat ##s [SEP] [CLS] <x> <x> on mat
    [SEP]" reads " sats [SEP] [CLS] <x> <x> on mat [SEP]"; spaces between
    special tokens off, each added token right after an added token loses
    its space (the first [SEP] follows "##s" and keeps it); special tokens
    skipped, the flag changes nothing: "<x>" is added but not special, so
    shown, and spaced as the decoder spaces it."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=_wordpiece_hf())
    prompt, output = [CLS, THE, CAT], [SAT, S, SEP, CLS, X, X, ON, MAT, SEP]

    def transformers_after(skip: bool) -> str:  # the joint decode less the prompt's
        return hf.decode(prompt + output, skip_special_tokens=skip)[
            len(hf.decode(prompt, skip_special_tokens=skip)):]

    spaced = " sats [SEP] [CLS] <x> <x> on mat [SEP]"
    assert transformers_after(False) == spaced
    cases = {(False, True): spaced,
             (False, False): " sats [SEP][CLS]<x><x> on mat [SEP]",
             (True, True): " sats <x> <x> on mat", (True, False): " sats <x> <x> on mat"}
    assert transformers_after(True) == cases[(True, True)]
    for (skip, spaces), want in cases.items():
        assert output_text(wordpiece, prompt, output, skip, spaces) == want
        assert _pieces(wordpiece, prompt, output, skip, spaces) == want
        assert _pieces(wordpiece, prompt, output, skip, spaces, cuts=[3, 2, 2]) == want
        assert vllm_fast_text(wordpiece.hf, prompt, output, skip, spaces) == want


def test_the_first_output_token_keeps_its_space_after_a_prompts_added_token(wordpiece):
    """As vLLM: the rule looks at the output's own tokens only, so an added
    first token after a prompt that ends in one is written as the decoder
    writes it; an added token after it is bare."""
    assert output_text(wordpiece, [THE, SEP], [CLS, X], False, False) == " [CLS]<x>"


@settings(max_examples=300, deadline=None)
@given(prompt=st.lists(st.integers(0, WP_VOCAB_SIZE - 1), min_size=1, max_size=8),
       output=st.lists(st.sampled_from([THE, CAT, S, CLS, SEP, X, X, SEP]), max_size=14),
       cuts=st.lists(st.integers(1, 4), max_size=8), skip=st.booleans(), spaces=st.booleans())
def test_wordpiece_text_is_vllms(wordpiece, prompt, output, cuts, skip, spaces):
    want = vllm_fast_text(wordpiece.hf, prompt, output, skip, spaces)
    assert output_text(wordpiece, prompt, output, skip, spaces) == want
    assert _pieces(wordpiece, prompt, output, skip, spaces, cuts) == want


# Whole characters of tiny's byte tokens (one to four bytes) and its added
# tokens <s> </s> <pad> (256..258), often in a row.
_CHARS = [list(c.encode()) for c in "ab é€😀"] + [[256], [257], [258]] * 3
_text_ids = st.lists(st.sampled_from(_CHARS), max_size=10).map(lambda cs: sum(cs, []))


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    """tiny's tokenizer, and transformers' over the same files."""
    from transformers import AutoTokenizer

    return Tokenizer.from_dir(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)


@settings(max_examples=200, deadline=None)
@given(prompt=_text_ids.filter(bool), output=_text_ids,
       cuts=st.lists(st.integers(1, 4), max_size=8), spaces=st.booleans())
def test_a_byte_level_decoder_writes_no_spaces_either_way(tiny, prompt, output, cuts, spaces):
    """tiny's decoder joins tokens as they are: special tokens shown, the
    text is transformers' decode of the output whatever the flag says."""
    tokenizer, hf = tiny
    want = hf.decode(output, skip_special_tokens=False)
    assert vllm_fast_text(tokenizer.hf, prompt, output, False, spaces) == want
    assert output_text(tokenizer, prompt, output, False, spaces) == want
    assert _pieces(tokenizer, prompt, output, False, spaces, cuts) == want
