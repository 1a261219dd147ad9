"""The tokenizer and chat template tprun builds from a GGUF file's metadata
against transformers' own GGUF tokenizer of the same file."""

from __future__ import annotations

import pytest
import transformers  # noqa: F401  (the oracle: a test dependency, never skipped)

from checkpoint.gguf_model import resolve_gguf
from checkpoint.tokenizer import IncrementalDetokenizer, Tokenizer

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


@pytest.mark.timeout(300)
def test_special_tokens_and_chat_template_match_transformers(tokenizers):
    ours, hf = tokenizers
    assert ours.bos_token_id == hf.bos_token_id == 1
    assert ours.eos_token_id == hf.eos_token_id == 2
    assert ours.chat_template == hf.chat_template
    assert "<|im_start|>" in ours.chat_template
    assert ours.vocab_size == len(hf) == 49152
    assert ours.token_text(ours.eos_token_id) == hf.eos_token
