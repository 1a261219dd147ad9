"""``Tokenizer.decode`` and ``batch_decode`` (what ``LLM.get_tokenizer()``
answers) take what a transformers fast tokenizer's take, with its results:
``clean_up_tokenization_spaces`` (given, or tokenizer_config.json's; a BPE
model left alone unless the config forces it), keywords a fast tokenizer
ignores (``spaces_between_special_tokens``), one id, a batch, an array or a
tensor. Reference: transformers' ``PreTrainedTokenizerFast`` loaded from
the same files. ``skip_special_tokens`` is given each time: its default is
vLLM's (True), where transformers' is False."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from checkpoint.tokenizer import Tokenizer
from tests.checkpoint.test_tokenizer import build_hf
from tests.helpers.wordpiece import WP_VOCAB_SIZE, WP_WORDS, wordpiece_tokenizer

BPE_FORCED = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
# (the tokenizer, its tokenizer_config.json): WordPiece, whose decoder writes
# " ." the clean-up removes, and byte-level BPE, clean-up asked for, forced or not.
CASES = {
    "wordpiece": (wordpiece_tokenizer, {}),
    "wordpiece-clean": (wordpiece_tokenizer, {"clean_up_tokenization_spaces": True}),
    "bpe-clean": (build_hf, {"clean_up_tokenization_spaces": True}),
    "bpe-forced": (build_hf, {"clean_up_tokenization_spaces": True, BPE_FORCED: True}),
}
OPTIONS = [{}, {"clean_up_tokenization_spaces": True}, {"clean_up_tokenization_spaces": False},
           {"spaces_between_special_tokens": False}, {"spaces_between_special_tokens": True},
           {"clean_up_tokenization_spaces": None, "spaces_between_special_tokens": False}]


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory) -> tuple[Tokenizer, PreTrainedTokenizerFast]:
    build, config = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    build().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer.from_dir(str(path)), PreTrainedTokenizerFast.from_pretrained(str(path))


def _text_ids(ours: Tokenizer) -> list[int]:
    """A text with what the clean-up removes, and a special token."""
    if ours.hf.token_to_id("##s") is not None:  # the WordPiece one
        return [WP_WORDS.index(w) for w in ("the", "cat", ".", "mat", "##s", ".")] + [
            WP_VOCAB_SIZE - 2]
    return ours.encode("hello , world . don 't") + [ours.hf.token_to_id("</s>")]


def test_the_clean_up_is_transformers(pair):
    ours, hf = pair
    ids = _text_ids(ours)
    for skip in (True, False):
        for options in OPTIONS:
            assert ours.decode(ids, skip, **options) == hf.decode(ids, skip, **options)
            assert ours.batch_decode([ids, ids[1:]], skip_special_tokens=skip, **options) == \
                hf.batch_decode([ids, ids[1:]], skip_special_tokens=skip, **options)
    # The clean-up changes this text unless the model is BPE and not forced.
    cleans = type(ours.hf.model).__name__ != "BPE" or getattr(hf, BPE_FORCED)
    cleaned = {ours.decode(ids, True, clean_up_tokenization_spaces=c) for c in (True, False)}
    assert len(cleaned) == (2 if cleans else 1)


def test_one_id_a_batch_an_array_and_a_tensor(pair):
    ours, hf = pair
    ids = _text_ids(ours)
    for token_ids in (ids[0], ids, tuple(ids), [ids, ids[:2], []], np.array(ids),
                      np.array([ids, ids]), torch.tensor(ids), torch.tensor([ids[:3], ids[1:4]]),
                      np.int64(ids[1]), []):
        for skip in (True, False):
            assert ours.decode(token_ids, skip, spaces_between_special_tokens=False) == \
                hf.decode(token_ids, skip, spaces_between_special_tokens=False)
    assert ours.batch_decode(np.array([ids, ids]), False) == \
        hf.batch_decode(np.array([ids, ids]), False)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, WP_VOCAB_SIZE - 1), max_size=12), skip=st.booleans(),
       options=st.sampled_from(OPTIONS))
def test_any_wordpiece_ids(ids, skip, options):
    """Added tokens in a row too: a fast tokenizer spaces them apart
    whatever ``spaces_between_special_tokens`` says (vLLM's detokenizer, not
    the tokenizer, writes them bare)."""
    ours = Tokenizer(wordpiece_tokenizer(), clean_up_tokenization_spaces=True)
    hf = PreTrainedTokenizerFast(tokenizer_object=wordpiece_tokenizer(),
                                 clean_up_tokenization_spaces=True)
    assert ours.decode(ids, skip, **options) == hf.decode(ids, skip, **options)
