"""An output's text under a SentencePiece tokenizer with byte fallback
(Llama 2's and Mistral's decoder: "▁" as a space, ``ByteFallback``,
``Fuse``, one leading space stripped), whose characters outside the
vocabulary are written as byte tokens ``<0xXX>``. Its decoder reads a run
of byte tokens as one: a run that is not UTF-8 throughout, as one that
begins inside a character, is U+FFFD for every byte, its whole
characters included. So the tokens an output is decoded after must begin
where a character begins. The reference is the decoder's own text of the
prompt and output together, less the prompt's text (its cut character's
U+FFFDs excepted: the output completes it), token by token
(``IncrementalDetokenizer``) and whole (``output_text``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as HFTokenizer

from checkpoint.tokenizer import (
    _TAIL_WINDOW_TOKENS,
    IncrementalDetokenizer,
    Tokenizer,
    _ends_held,
    output_text,
)

_WORDS = ["\u2581", "a", "x", "\u2581a", "\u2581x"]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    vocab.update({w: 259 + i for i, w in enumerate(_WORDS)})
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                          normalizers.Replace(" ", "\u2581")])
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    hf.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    return Tokenizer(hf, bos_token_id=1, eos_token_id=2)


def _bytes(text: str) -> list[int]:
    return [3 + b for b in text.encode()]


def _check(tok: Tokenizer, prompt: list[int], output: list[int], want: str) -> None:
    whole = tok.hf.decode([*prompt, *output])
    prompt_text = tok.hf.decode(prompt)
    kept = prompt_text.rstrip("\ufffd")
    assert whole.startswith(kept) and whole[len(kept):] == want
    detok = IncrementalDetokenizer(tok, prompt)
    assert "".join(detok.feed([t]) for t in output) == want == detok.output_text
    assert output_text(tok, prompt, output) == want


@pytest.mark.parametrize("tail", ["€😀", "日本", "x€€€😀"])
def test_an_output_of_byte_tokens_after_a_prompt_that_ends_in_them(tok, tail):
    """The prompt ends in characters written as byte tokens, more of them
    than the few prompt tokens an output is decoded after; the output
    begins with one too."""
    prompt = [1, 263, *_bytes(tail)]
    assert tok.hf.decode(prompt) == "x" + tail
    _check(tok, prompt, [*_bytes("🦙"), 262], "🦙 a")


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_an_output_after_a_prompt_that_ends_inside_a_character(tok, cut):
    """The prompt ends with the first bytes of 🦙; the output completes it,
    then writes 😀 in byte tokens: the tokens that completed 🦙 begin inside
    it, so the text after them is decoded from the character's start."""
    llama = _bytes("🦙")
    prompt = [1, 263, *llama[:cut]]
    _check(tok, prompt, [*llama[cut:], *_bytes("😀"), 262], "🦙😀 a")


@pytest.mark.parametrize("run, replacements", [(_bytes("\ufffd") * 700, 700),
                                               ([3 + 0x80] * 2000, 2000),
                                               ([*_bytes("\ufffd") * 700, 3 + 0xEF], 2101)])
def test_a_long_run_of_byte_tokens_held_back_costs_its_length(tok, monkeypatch, run,
                                                               replacements):
    """Some two thousand byte tokens whose text ends in U+FFFD at every step
    (U+FFFD's own bytes, stray bytes, U+FFFDs and a cut character, which
    make the whole run one U+FFFD a byte), then " a": the text is the
    decoder's own, token by token and whole, and no U+FFFD without the
    " a"; each decode but those of the one release reads a dozen ids at
    most, all of them together a few dozen per token (counted, no clock)."""
    decoded: list[int] = []
    raw_decode = tok.raw_decode

    def counted(ids, skip_special_tokens=True):
        decoded.append(len(ids))
        return raw_decode(ids, skip_special_tokens)

    monkeypatch.setattr(tok, "raw_decode", counted)
    prompt, output = [1, 263], [*run, 262]
    _check(tok, prompt, output, "\ufffd" * replacements + " a")
    assert len([n for n in decoded if n > 12]) <= 6 and sum(decoded) <= 60 * len(output)
    decoded.clear()
    detok = IncrementalDetokenizer(tok, prompt)
    assert "".join(detok.feed([t]) for t in run) == "" == output_text(tok, prompt, run)
    assert len([n for n in decoded if n > 12]) <= 1 and sum(decoded) <= 60 * len(output)


_PIECES = ["€", "😀", "é", "\ufffd", "a"]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.tuples(st.sampled_from(_PIECES), st.integers(1, 4), st.booleans()),
                      min_size=2, max_size=12),
       strays=st.lists(st.integers(0, 30), max_size=3),
       words=st.lists(st.tuples(st.integers(0, 40), st.sampled_from([1, 2, 259, 262, 263])),
                      max_size=4),
       skip=st.booleans())
def test_a_held_tail_says_held_only_where_the_whole_text_is(tok, parts, strays, words, skip):
    """``_ends_held`` (the last few tokens' windows) may say the text ends
    in U+FFFD only where the decode of all the tokens before ``end``, from
    any start, does: a wrong "held" would hold back text the decoder
    writes. Byte tokens of whole and cut characters, stray bytes, words
    and special tokens in between, against the decoder's own text."""
    ids: list[int] = []
    for text, cut, whole in parts:
        data = text.encode()
        ids += [3 + b for b in (data if whole else data[:cut])]
    for at in strays:
        ids.insert(min(at, len(ids)), 3 + 0x80)
    for at, word in words:
        ids.insert(min(at, len(ids)), word)
    for end in range(_TAIL_WINDOW_TOKENS, len(ids) + 1):
        if _ends_held(tok, ids, end, skip):
            for start in range(end - _TAIL_WINDOW_TOKENS + 1):
                assert tok.raw_decode(ids[start:end], skip).endswith("\ufffd"), (start, end)
