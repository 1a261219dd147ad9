"""Text as the HTTP API shows it: stop strings matched on released text,
and incremental detokenization, each against the plain whole-text answer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint.tiny_model import ensure_tiny_model
from checkpoint.tokenizer import IncrementalDetokenizer, Tokenizer, output_text
from engine.stop_strings import OutputStops, StopStringMatcher
from ipc.engine_messages import TokenLogprob
from tests.helpers.hf_models import SPM_PIECES, sentencepiece_style_tokenizer


def _run_matcher(pieces: list[str], stops: list[str]) -> tuple[list[str], str | None]:
    matcher = StopStringMatcher(stops)
    released = [matcher.feed(p) for p in pieces]
    released.append(matcher.flush())
    return released, matcher.stopped


def _reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """The text cut before the earliest stop string, and whether one was found."""
    hits = [i for s in stops if (i := text.find(s)) >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.text(alphabet="abc", max_size=4), max_size=12),
       stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), max_size=8))
def test_stop_strings_match_the_whole_text(pieces, stops):
    released, stopped = _run_matcher(pieces, stops)
    expected, found = _reference("".join(pieces), stops)
    assert "".join(released) == expected
    assert (stopped is not None) == found
    if found:
        assert stopped in stops and "".join(pieces).find(stopped) == len(expected)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.text(alphabet="abc", max_size=4), max_size=12),
       stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), max_size=8))
def test_include_stop_keeps_the_earliest_stop_string(pieces, stops):
    """vLLM's ``include_stop_str_in_output``: the text up to the end of the
    earliest stop string (of two starting there, the shorter: it ends first)."""
    matcher = StopStringMatcher(stops, include_stop=True)
    released = "".join([matcher.feed(p) for p in pieces] + [matcher.flush()])
    text = "".join(pieces)
    hits = [(i, len(s), s) for s in stops if (i := text.find(s)) >= 0]
    if hits:
        i, length, stop = min(hits)
        assert (released, matcher.stopped) == (text[: i + length], stop)
    else:
        assert (released, matcher.stopped) == (text, None)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.text(alphabet="abc", max_size=3), max_size=12),
       stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=4))
def test_the_stop_tokens_end_at_the_piece_that_completed_the_stop_string(pieces, stops):
    """``OutputStops.num_stop_tokens``, pieces of one token each: the
    fewest pieces whose text holds the earliest stop string whole, however
    many pieces the match took to decide (the reference: a plain search)."""
    output = OutputStops(stops)
    for i, piece in enumerate(pieces):
        output.add(piece, 1, last=i == len(pieces) - 1)
        if output.stopped is not None:
            break
    text = "".join(pieces)
    hits = [(i, len(s)) for s in stops if (i := text.find(s)) >= 0]
    if not hits:
        assert output.stopped is None and output.num_stop_tokens is None
        return
    start, length = min(hits)
    want = next(k for k in range(len(pieces) + 1)
                if len("".join(pieces[:k])) >= start + length)
    assert output.num_stop_tokens == want


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
       output=st.lists(_token_ids, max_size=40), cuts=st.lists(st.integers(1, 4), max_size=40))
def test_incremental_detokenizer_equals_full_decode(tokenizer, prompt, output, cuts):
    """Text prompts, and token-id prompts that may end inside a character."""
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    detok = IncrementalDetokenizer(tokenizer, ids)
    full = tokenizer.decode(output)
    shown, start = "", 0
    for size in [*cuts, len(output)]:
        chunk = output[start:start + size]
        start += len(chunk)
        piece = detok.feed(chunk)
        shown += piece
        # Never half a character: what is shown is always a prefix of the final text.
        assert full.startswith(shown)
        assert not piece.endswith("\ufffd") or full[: len(shown)].endswith("\ufffd")
        if start >= len(output):
            break
    shown += detok.finish()
    assert shown == full == detok.output_text


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, len(SPM_PIECES) - 1), min_size=1, max_size=8),
       output=st.lists(st.integers(0, len(SPM_PIECES) - 1), max_size=12),
       cuts=st.lists(st.integers(1, 3), max_size=12), skip=st.booleans())
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
    shown += detok.feed(output[start:]) + detok.finish()
    head = spm.decode(prompt, skip)
    joint = spm.decode(prompt + output, skip)
    assert joint.startswith(head)
    assert shown == output_text(spm, prompt, output, skip) == joint[len(head):]


def test_detokenizer_holds_a_split_character_back(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("x"))
    euro = list("€".encode())
    assert detok.feed(euro[:1]) == "" and detok.feed(euro[1:2]) == ""
    assert detok.feed(euro[2:]) == "€"
    assert detok.feed(euro[:2]) == ""
    assert detok.finish() == tokenizer.decode(euro[:2]) == "\ufffd"


def test_a_stop_string_waits_for_a_longer_one_that_begins_earlier():
    # "a" is complete in "ba", but "baa" may still begin at 0: nothing is released yet
    assert _run_matcher(["ba", "a"], ["a", "baa"]) == (["", "", ""], "baa")
    # the output ends after "ba": "baa" never came, so "a" cuts it
    assert _run_matcher(["ba"], ["a", "baa"]) == (["", "b"], "a")


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


def _reference_after(text: str, stops: list[str], unmatched: int) -> tuple[str, bool]:
    """The text cut before the earliest stop string that ends past its first
    ``unmatched`` characters (vLLM's rule under ``min_tokens``), and whether
    there is one."""
    hits = [i for s in stops if (i := text.find(s, max(0, unmatched - len(s) + 1))) >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.text(alphabet="abc", max_size=4), max_size=12),
       num_released=st.integers(0, 12),
       stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), max_size=8))
def test_released_text_ends_no_stop_string_but_may_begin_one(pieces, num_released, stops):
    matcher = StopStringMatcher(stops)
    out = [matcher.release(p) for p in pieces[:num_released]]
    out += [matcher.feed(p) for p in pieces[num_released:]]
    out.append(matcher.flush())
    expected, found = _reference_after("".join(pieces), stops,
                                       len("".join(pieces[:num_released])))
    assert "".join(out) == expected
    assert (matcher.stopped is not None) == found


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
