"""GrowingText against the plain string it stands for: every span, the
whole text and its length agree, across the joins of its pieces."""

import random

from checkpoint.growing_text import CHUNK_PIECES, GrowingText


def test_spans_and_text_equal_the_plain_strings_across_joins():
    rng = random.Random(7)
    for _ in range(300):
        text, plain = GrowingText(), ""
        for _ in range(rng.randint(0, 3 * CHUNK_PIECES)):
            piece = "".join(rng.choice("ab\u00e9") for _ in range(rng.randint(0, 4)))
            text.add(piece)
            plain += piece
            start = rng.randint(0, len(plain) + 2)
            end = rng.choice([None, rng.randint(0, len(plain) + 3)])
            assert text.span(start, end) == plain[start:end]
        assert str(text) == plain and len(text) == len(plain)


def test_every_chunk_of_pieces_is_joined_into_one():
    text = GrowingText()
    for _ in range(2 * CHUNK_PIECES + 3):
        text.add("x")
    assert text.pieces == ["x" * CHUNK_PIECES] * 2 + ["x"] * 3
    assert text.starts == [0, CHUNK_PIECES, 2 * CHUNK_PIECES, 2 * CHUNK_PIECES + 1,
                           2 * CHUNK_PIECES + 2]
