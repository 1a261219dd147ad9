"""An output's text ends where vLLM's detokenizer of a fast tokenizer
stops releasing it: what is still held back when the output ends (an
incomplete UTF-8 character, a token that decodes to U+FFFD) is never shown,
while a U+FFFD followed by more text is. On tiny's byte-level tokenizer
(ids are byte values; 256..258 its special tokens), token by token
(``IncrementalDetokenizer``), fed in parts, and whole (``output_text``),
against ``DecodeStream`` written out as vLLM uses it
(``tests/helpers/vllm_detokenizer.py``, with its one documented difference:
an output after a prompt whose text ends in U+FFFD) and hand-worked texts.
After a prompt whose ids end inside a character, the output's text is what
prompt and output decoded together add after the prompt's text: the
character completed, then the rest."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from checkpoint.tokenizer import IncrementalDetokenizer, Tokenizer, output_text
from tests.helpers.vllm_detokenizer import vllm_fast_pieces, vllm_fast_text

A, B = ord("a"), ord("b")
EURO = list("€".encode())  # E2 82 AC
REPLACEMENT = list("\ufffd".encode())  # EF BF BD: a token text that is U+FFFD itself


@pytest.fixture(scope="module")
def tiny(tiny_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


@pytest.mark.parametrize("output, want", [
    ([A, 0xC3, A, 0xC3], "a\ufffda"),  # a lone lead byte inside, another at the end
    ([0xC3, 0xC3, 0xC3], ""),
    ([0xC3, B], "\ufffdb"),
    ([A, *EURO, *EURO[:2]], "a€"),  # a character cut by the end
    ([*EURO, 0xAC], "€"),  # a stray continuation byte at the end: U+FFFD, held too
    ([A, *REPLACEMENT], "a"),
    ([0xAC, B], "\ufffdb"),
    ([A, *REPLACEMENT, B], "a\ufffdb"),
    ([A, 0xE2, 256, 257], "a"),  # skipped special tokens add nothing after it
])
def test_hand_worked(tiny, output, want):
    prompt = tiny.encode("x")
    assert vllm_fast_text(tiny.hf, prompt, output) == want
    assert output_text(tiny, prompt, output) == want
    detok = IncrementalDetokenizer(tiny, prompt)
    assert [detok.feed([t]) for t in output] == vllm_fast_pieces(tiny.hf, prompt, output)
    assert detok.output_text == want


def test_special_tokens_shown_release_what_came_before(tiny):
    """Shown, "<s>" completes nothing but ends the text in a whole
    character: the lone byte before it is released as U+FFFD."""
    prompt, output = tiny.encode("x"), [A, 0xE2, 256, 0xC3]
    assert vllm_fast_text(tiny.hf, prompt, output, False) == "a\ufffd<s>"
    assert output_text(tiny, prompt, output, False) == "a\ufffd<s>"


@pytest.mark.parametrize("skip, leaked", [(True, "\ufffda"), (False, "<s>\ufffda")])
def test_an_output_after_a_prompt_that_ends_in_replacement(tiny, skip, leaked):
    """Prompt "\ufffd" (BOS, then EF BF BD), output "a". vLLM's stream primed
    with the prompt has no prefix, its text ending in U+FFFD, so its first
    piece begins with the prompt's text; tprun's text is what the output
    adds, "a", and the reference takes it so (its documented difference)."""
    from tokenizers.decoders import DecodeStream

    prompt = tiny.encode("\ufffd")
    assert prompt == [256, *REPLACEMENT]
    assert DecodeStream(ids=prompt, skip_special_tokens=skip).step(tiny.hf, A) == leaked
    assert vllm_fast_pieces(tiny.hf, prompt, [A], skip) == ["a"]
    assert IncrementalDetokenizer(tiny, prompt, skip).feed([A]) == "a"
    assert output_text(tiny, prompt, [A], skip) == "a"


@pytest.mark.parametrize("cut, output, whole, want", [
    (EURO[:2], [EURO[2], A], "x€a", ["€", "a"]),
    (EURO[:1], [EURO[1], EURO[2], A], "x€a", ["", "€", "a"]),
    (list("😀".encode())[:3], [list("😀".encode())[3]], "x😀", ["😀"]),
    # never completed: the prompt's bytes stay its U+FFFD
    (EURO[:1], [A], "x\ufffda", ["a"]),
    (EURO[:2], [0xC3, A], "x\ufffd\ufffda", ["", "\ufffda"]),
])
@pytest.mark.parametrize("skip", [True, False])
def test_an_output_after_a_prompt_that_ends_inside_a_character(tiny, cut, output, whole, want,
                                                                skip):
    """The prompt "x" then the first bytes of a character: the text of
    prompt and output decoded together, less the prompt's text ("x\ufffd",
    or "x" where the output completes the character)."""
    prompt = [*tiny.encode("x"), *cut]
    bos = "" if skip else "<s>"
    assert tiny.hf.decode(prompt, skip_special_tokens=skip) == bos + "x\ufffd"
    assert tiny.hf.decode([*prompt, *output], skip_special_tokens=skip) == bos + whole
    detok = IncrementalDetokenizer(tiny, prompt, skip)
    assert [detok.feed([t]) for t in output] == want
    assert vllm_fast_pieces(tiny.hf, prompt, output, skip) == want
    assert output_text(tiny, prompt, output, skip) == "".join(want)


# Whole characters (one to four bytes), lone lead bytes, stray continuation
# bytes, U+FFFD's own bytes, special tokens; then a character cut short.
_PIECES = [[A], [ord(" ")], list("é".encode()), EURO, list("😀".encode()), [0xC3], [0xF0],
           [0x82], REPLACEMENT, [256], [257], [258]]
_CUT = [[], [0xC3], EURO[:2], list("😀".encode())[:3], REPLACEMENT]
_outputs = st.tuples(st.lists(st.sampled_from(_PIECES), max_size=10),
                     st.sampled_from(_CUT)).map(lambda p: sum(p[0], []) + p[1])


@settings(max_examples=300, deadline=None)
@example(prompt="\ufffd", prompt_cut=[], output=[A], cuts=[], skip=True, spaces=True)
@example(prompt="\ufffd", prompt_cut=[], output=[A], cuts=[], skip=False, spaces=False)
@example(prompt="x", prompt_cut=EURO[:2], output=[EURO[2], A], cuts=[], skip=True, spaces=True)
@given(prompt=st.text(max_size=5), prompt_cut=st.sampled_from(_CUT), output=_outputs,
       cuts=st.lists(st.integers(1, 4), max_size=10), skip=st.booleans(), spaces=st.booleans())
def test_pieces_and_text_are_vllms(tiny, prompt, prompt_cut, output, cuts, skip, spaces):
    """Prompts end in whole characters or inside one (``prompt_cut``)."""
    ids = [*tiny.encode(prompt), *prompt_cut]
    want = vllm_fast_pieces(tiny.hf, ids, output, skip, spaces)
    detok = IncrementalDetokenizer(tiny, ids, skip, spaces)
    assert [detok.feed([t]) for t in output] == want
    parts = IncrementalDetokenizer(tiny, ids, skip, spaces)
    start = 0
    for size in [*cuts, len(output)]:
        assert parts.feed(output[start:start + size]) == "".join(want[start:start + size])
        start += size
    assert detok.output_text == parts.output_text == "".join(want) == \
        output_text(tiny, ids, output, skip, spaces)


def _counted_decodes(monkeypatch, tokenizer: Tokenizer) -> list[int]:
    """The number of ids each later ``raw_decode`` of ``tokenizer`` reads."""
    decoded: list[int] = []
    raw_decode = tokenizer.raw_decode

    def counted(ids, skip_special_tokens=True):
        decoded.append(len(ids))
        return raw_decode(ids, skip_special_tokens)

    monkeypatch.setattr(tokenizer, "raw_decode", counted)
    return decoded


# Each run with the U+FFFDs it reads as: one a character, a stray byte, a
# lone lead byte, a cut character.
@pytest.mark.parametrize("run, replacements", [(REPLACEMENT * 700, 700), ([0x80] * 2000, 2000),
                                               ([0xC3] * 2000, 2000), ([0xF0, 0x9F] * 1000, 1000)])
@pytest.mark.parametrize("after", [[], [B], [*EURO, 0xE2]])
def test_a_long_held_run_costs_its_length(tiny, monkeypatch, run, replacements, after):
    """Some two thousand tokens whose text ends in U+FFFD at every step (the
    character's own bytes, stray continuation bytes, lone lead bytes, cut
    characters), then nothing, "b", or "€" and a cut character: the pieces
    are vLLM's (held throughout, then all released with the first token
    that ends the text in a whole character, or never), the whole text
    too, while each decode but those of that one release reads a dozen
    ids at most and all of them together a few dozen per token (counted,
    no clock), where deciding at each token whether the run is held by
    decoding all of it would read some two million."""
    prompt, output = tiny.encode("x"), [A, *run, *after]
    want = vllm_fast_pieces(tiny.hf, prompt, output)
    decoded = _counted_decodes(monkeypatch, tiny)
    detok = IncrementalDetokenizer(tiny, prompt)
    assert [detok.feed([t]) for t in output] == want
    text = "a" + ("\ufffd" * replacements + {(): "", (B,): "b"}.get(tuple(after), "€")
                  if after else "")
    assert detok.output_text == "".join(want) == text
    assert len([n for n in decoded if n > 12]) <= 2 and sum(decoded) <= 30 * len(output)
    decoded.clear()
    assert output_text(tiny, prompt, output) == text
    assert len([n for n in decoded if n > 12]) <= 2 and sum(decoded) <= 30 * len(output)
