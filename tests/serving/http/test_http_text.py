"""Text as the HTTP API shows it: stop strings matched on released text,
against vLLM's check written out, and incremental detokenization, against
vLLM's detokenizer of a fast tokenizer written out
(``tests/helpers/vllm_detokenizer.py``) and the whole-text answer."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from checkpoint.tiny_model import ensure_tiny_model
from checkpoint.tokenizer import IncrementalDetokenizer, Tokenizer, output_text
from engine.stop_strings import StopStringMatcher
from ipc.engine_messages import TokenLogprob
from tests.helpers.hf_models import SPM_PIECES, sentencepiece_style_tokenizer
from tests.helpers.vllm_detokenizer import vllm_fast_pieces, vllm_fast_text


def _run_matcher(pieces: list[str], stops: list[str]) -> tuple[list[str], str | None]:
    matcher = StopStringMatcher(stops)
    released = [matcher.feed(p) for p in pieces]
    released.append(matcher.flush())
    return released, matcher.stopped


def _vllm_stop(pieces: list[str], stops: list[str], include: bool = False,
               num_released: int = 0) -> tuple[str, str | None, int | None]:
    """vLLM's rule written out (its check over each new piece of text): after
    each piece past the first ``num_released`` (text below ``min_tokens``),
    the stop strings in list order, each searched from where it could end in
    the new text; the first found ends the output. (text kept, stop string,
    the piece that completed it), or (the whole text, None, None)."""
    text = ""
    for k, piece in enumerate(pieces):
        text += piece
        if k < num_released or not piece:
            continue
        for stop in stops:
            i = text.find(stop, max(0, len(text) - len(piece) - len(stop) + 1))
            if i >= 0:
                return (text[: i + len(stop)] if include else text[:i]), stop, k
    return text, None, None


def _fed(matcher: StopStringMatcher, pieces: list[str],
         num_released: int = 0) -> tuple[str, int | None]:
    """What the matcher releases of ``pieces`` (the first ``num_released``
    given to ``release``), and after which piece it stopped."""
    out, stopped_at = [], None
    for k, piece in enumerate(pieces):
        out.append(matcher.release(piece) if k < num_released else matcher.feed(piece))
        if matcher.stopped is not None and stopped_at is None:
            stopped_at = k
    out.append(matcher.flush())
    return "".join(out), stopped_at


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.text(alphabet="abc", max_size=4), max_size=12),
       stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), max_size=8),
       include=st.booleans())
def test_stop_strings_end_the_text_as_vllm_checks_them(pieces, stops, include):
    """The first piece that completes a stop string ends the output there;
    of several it completes, the first in the list, at its first occurrence
    ending in it (with ``include_stop_str_in_output``, kept)."""
    matcher = StopStringMatcher(stops, include_stop=include)
    text, stopped_at = _fed(matcher, pieces)
    assert (text, matcher.stopped, stopped_at) == _vllm_stop(pieces, stops, include)


def test_stop_string_across_pieces_is_never_shown():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("abc ST") == "abc "  # "ST" may start the stop string: held back
    assert matcher.feed("O") == ""
    assert matcher.feed("P and more") == ""
    assert matcher.stopped == "STOP" and matcher.flush() == ""


def test_held_back_prefix_is_released_when_it_is_not_a_stop():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("abc ST") == "abc "
    assert matcher.feed("ay") == "STay"
    assert matcher.feed("S") == ""
    assert matcher.flush() == "S" and matcher.stopped is None


def test_empty_stop_string_is_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        StopStringMatcher(["a", ""])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_dir(ensure_tiny_model(str(tmp_path_factory.mktemp("cache"))))


# Byte tokens of tiny (ids are byte values) biased towards UTF-8 lead and
# continuation bytes, so characters split across tokens and invalid
# sequences are common; plus the special tokens 256..258.
_token_ids = st.one_of(st.integers(0x80, 0xF4), st.integers(0, 258), st.sampled_from(
    list("é€😀a ".encode())))


@settings(max_examples=300, deadline=None)
@given(prompt=st.one_of(st.text(max_size=6), st.lists(_token_ids, min_size=1, max_size=8)),
       output=st.lists(_token_ids, max_size=40), cuts=st.lists(st.integers(1, 4), max_size=40),
       skip=st.booleans())
def test_incremental_detokenizer_gives_vllms_pieces(tokenizer, prompt, output, cuts, skip):
    """Text prompts, and token-id prompts that may end inside a character
    (then decoded without the prompt: ``tests/helpers/vllm_detokenizer.py``).
    Fed in parts, each part's piece is vLLM's pieces of its tokens joined;
    the text never gets what vLLM still holds back at the end (an
    incomplete character, a U+FFFD), and ``output_text`` is the same text."""
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    want = vllm_fast_pieces(tokenizer.hf, ids, output, skip)
    detok = IncrementalDetokenizer(tokenizer, ids, skip)
    start = 0
    for size in [*cuts, len(output)]:
        chunk = output[start:start + size]
        assert detok.feed(chunk) == "".join(want[start:start + len(chunk)])
        start += len(chunk)
        if start >= len(output):
            break
    assert detok.output_text == "".join(want) == output_text(tokenizer, ids, output, skip)


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, len(SPM_PIECES) - 1), min_size=1, max_size=8),
       output=st.lists(st.integers(0, len(SPM_PIECES) - 1), max_size=12),
       cuts=st.lists(st.integers(1, 3), max_size=12), skip=st.booleans())
@example(prompt=[3, 0, 0, 0, 0, 0], output=[3], cuts=[], skip=True)  # skipped <unk>s close it
def test_text_after_a_prompt_with_a_sentencepiece_decoder(prompt, output, cuts, skip):
    """A decoder that drops the first token's leading space (SentencePiece's):
    the pieces, and ``output_text`` in one decode, are the text the output
    adds after the prompt: the two decoded together less the prompt's text."""
    spm = Tokenizer(sentencepiece_style_tokenizer(), 1, 2)
    detok = IncrementalDetokenizer(spm, prompt, skip)
    shown, start = "", 0
    for size in cuts:
        shown += detok.feed(output[start:start + size])
        start += size
    shown += detok.feed(output[start:])
    head = spm.decode(prompt, skip)
    joint = spm.decode(prompt + output, skip)
    assert joint.startswith(head)
    assert shown == output_text(spm, prompt, output, skip) == joint[len(head):]


def test_detokenizer_holds_a_split_character_back(tokenizer):
    """Hand-worked: "€" is E2 82 AC; its text comes with its last byte. The
    first two bytes of another at the end are never shown, as vLLM's
    stream never releases them (a decode of the ids would end in U+FFFD)."""
    prompt = tokenizer.encode("x")
    detok = IncrementalDetokenizer(tokenizer, prompt)
    euro = list("€".encode())
    assert detok.feed(euro[:1]) == "" and detok.feed(euro[1:2]) == ""
    assert detok.feed(euro[2:]) == "€"
    assert detok.feed(euro[:2]) == ""
    output = euro + euro[:2]
    assert tokenizer.decode(output) == "€\ufffd"
    assert detok.output_text == output_text(tokenizer, prompt, output) == "€"
    assert vllm_fast_text(tokenizer.hf, prompt, output) == "€"


def test_the_first_stop_string_completed_ends_the_text():
    """Hand-worked, as vLLM checks them: "a" is complete in "ba" though the
    longer "baa" begins earlier; of two that one piece completes, the first
    in the list wins."""
    assert _run_matcher(["ba", "a"], ["a", "baa"]) == (["b", "", ""], "a")
    assert _run_matcher(["b", "a", "a"], ["baa", "a"]) == (["", "b", "", ""], "a")
    assert _run_matcher(["x", "ab"], ["b", "ab"]) == (["x", "a", ""], "b")
    assert _run_matcher(["x", "ab"], ["ab", "b"]) == (["x", "", ""], "ab")


@pytest.mark.parametrize("split", [7, 1, 2, 5])
def test_text_offsets_follow_whole_characters(tokenizer, split):
    """The tiny tokenizer's ids are bytes. "€" (E2 82 AC) over three tokens,
    then "]", then "é" (C3 A9) over two, then "a": hand-worked, € and its
    parts at 0, ] at 1, é at 2, a at 3; the same when the tokens come in two
    parts (two deltas), even with a character split between them."""
    from serving.http.logprobs import LogprobsFormatter, TextOffsets

    ids = [0xE2, 0x82, 0xAC, ord("]"), 0xC3, 0xA9, ord("a")]
    entries = [[TokenLogprob(token_id=t, logprob=-1.0, rank=1)] for t in ids]
    formatter, offsets = LogprobsFormatter(tokenizer), TextOffsets()
    parts = [formatter.completion(ids[:split], entries[:split], 1, offsets),
             formatter.completion(ids[split:], entries[split:], 1, offsets)]
    assert parts[0]["text_offset"] + parts[1]["text_offset"] == [0, 0, 0, 1, 2, 2, 3]


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.text(alphabet="abc", max_size=4), max_size=12),
       num_released=st.integers(0, 12),
       stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), max_size=8))
def test_released_text_ends_no_stop_string_but_may_begin_one(pieces, num_released, stops):
    matcher = StopStringMatcher(stops)
    text, stopped_at = _fed(matcher, pieces, num_released)
    assert (text, matcher.stopped, stopped_at) == _vllm_stop(pieces, stops,
                                                             num_released=num_released)


def test_a_stop_string_that_min_tokens_splits_still_ends_the_text():
    """Hand-worked: "ab" is the stop; "xa" is released below min_tokens (the
    "a" held back, as it may begin "ab"), then "b" completes it: the text
    ends at "x". A stop string wholly inside the released text ends nothing."""
    matcher = StopStringMatcher(["ab"])
    assert matcher.release("xa") == "x"
    assert matcher.feed("bc") == "" and matcher.stopped == "ab"
    matcher = StopStringMatcher(["ab"])
    assert matcher.release("abx") == "abx"
    assert matcher.feed("y") == "y" and matcher.stopped is None
