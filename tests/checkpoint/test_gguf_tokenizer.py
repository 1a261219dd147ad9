"""The tokenizer and chat template tprun builds from a GGUF file's metadata
against transformers' own GGUF tokenizer of the same file. ``encode`` (which
runs the tokenizers library's ``encode_batch`` of the one text, to let
other threads run) gives the ids of the library's plain ``encode`` and of
transformers on any text: generated ones mixing special-token strings,
whitespace and emoji, the empty text and a very long one."""

from __future__ import annotations

import pytest
import transformers  # noqa: F401  (the oracle: a test dependency, never skipped)
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint.gguf_model import resolve_gguf
from checkpoint.tokenizer import IncrementalDetokenizer, Tokenizer, output_text

TEXTS = [
    "Hello, my name is",
    "  leading spaces and trailing   ",
    "Les élèves ont étudié à l'école; naïve café, Ærøskøbing, Straße",
    "Emoji: 🦙🚀👩‍👩‍👧 and CJK 日本語のテキスト, 한국어",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\tx = {'a': [1, 2]}",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after<|im_end|><repo_name>",
    "numbers 1234567 3.14159 -42 1e-5",
    "\n\n\r\n tabs\tand\u00a0nbsp",
]


@pytest.fixture(scope="module")
def tokenizers(smollm2, smollm2_hf_tokenizer):
    hf = smollm2_hf_tokenizer
    ours = Tokenizer.from_dir(resolve_gguf(smollm2))
    return ours, hf


@pytest.mark.timeout(300)
@pytest.mark.parametrize("text", TEXTS)
def test_ids_and_text_match_transformers(tokenizers, text):
    ours, hf = tokenizers
    ids = ours.encode(text)
    assert ids == hf(text).input_ids
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    pieces = IncrementalDetokenizer(ours)
    assert "".join(pieces.feed([t]) for t in ids) == ours.decode(ids)


# Pieces generated texts are made of, besides arbitrary text: special-token
# strings (whole, and glued to others), whitespace runs and emoji sequences.
PIECES = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<|im_start", " ",
          "  ", "\n", "\r\n", "\t", "\u00a0", "\u3000", "🦙", "👩‍👩‍👧", "é", "日本"]
TEXTS_MADE = st.lists(st.one_of(st.text(), st.sampled_from(PIECES)), max_size=12).map("".join)


@pytest.mark.timeout(300)
@settings(max_examples=300, deadline=None)
@given(text=TEXTS_MADE)
def test_encode_gives_the_ids_of_plain_encode_and_transformers(tokenizers, text):
    ours, hf = tokenizers
    assert ours.encode(text) == ours.hf.encode(text).ids == hf(text).input_ids
    assert ours.encode(text, add_special_tokens=False) == \
        ours.hf.encode(text, add_special_tokens=False).ids == \
        hf(text, add_special_tokens=False).input_ids


@pytest.mark.timeout(300)
@pytest.mark.parametrize("text", ["", " ", "\n\n\t  \r\n", "🦙" * 40,
                                  "<|im_start|>" * 30, "Hé 🦙 <|im_end|>\n" * 20_000])
def test_encode_of_odd_texts_gives_the_ids_of_plain_encode_and_transformers(tokenizers, text):
    ours, hf = tokenizers
    assert ours.encode(text) == ours.hf.encode(text).ids == hf(text).input_ids


@pytest.mark.timeout(300)
def test_special_tokens_and_chat_template_match_transformers(tokenizers):
    ours, hf = tokenizers
    assert ours.bos_token_id == hf.bos_token_id == 1
    assert ours.eos_token_id == hf.eos_token_id == 2
    assert ours.chat_template == hf.chat_template
    assert "<|im_start|>" in ours.chat_template
    assert ours.vocab_size == len(hf) == 49152
    assert ours.token_text(ours.eos_token_id) == hf.eos_token


def _after_cut_prompt(ours, hf, prompt: list[int], output: list[int]) -> str:
    """The output's text, token by token and whole, after a prompt whose
    text (as transformers decodes it) ends in U+FFFD; checked to be
    transformers' text of all the ids less the prompt's text before that
    U+FFFD (the output completes the character the prompt began)."""
    prompt_text = hf.decode(prompt)
    assert prompt_text.endswith("\ufffd")
    whole = hf.decode([*prompt, *output])
    kept = prompt_text.removesuffix("\ufffd")
    assert whole.startswith(kept)
    pieces = IncrementalDetokenizer(ours, prompt)
    assert "".join(pieces.feed([t]) for t in output) == whole[len(kept):]
    assert output_text(ours, prompt, output) == whole[len(kept):]
    return whole[len(kept):]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("text", ["I like 🦙 a lot", "日本語のテキスト"])
def test_output_after_a_prompt_cut_inside_a_character(tokenizers, text):
    """Every cut of the text's ids where the prompt ends inside a character."""
    ours, hf = tokenizers
    ids = ours.encode(text, add_special_tokens=False)
    cuts = [n for n in range(1, len(ids)) if hf.decode(ids[:n]).endswith("\ufffd")]
    assert cuts, "the text's tokens never end inside a character"
    for n in cuts:
        assert _after_cut_prompt(ours, hf, ids[:n], ids[n:]) == text[len(hf.decode(ids[:n])) - 1:]


@pytest.mark.timeout(300)
def test_output_after_a_prompt_that_ends_in_a_lead_byte(tokenizers):
    """"Caf" then é's first byte (its byte-level token "Ã"); the output: é's
    second byte ("©"), then " au lait"."""
    ours, hf = tokenizers
    prompt = [*ours.encode("Caf", add_special_tokens=False), ours.convert_tokens_to_ids("Ã")]
    output = [ours.convert_tokens_to_ids("©"), *ours.encode(" au lait", add_special_tokens=False)]
    assert _after_cut_prompt(ours, hf, prompt, output) == "é au lait"
