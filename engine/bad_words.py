"""vLLM's ``bad_words``: words turned into the token sequences the runner bans.

A word w gives the ids of ``w.lstrip()`` (its form at the start of a text),
and the ids of ``" " + w.lstrip()`` (its form after a space) as a second
sequence only where they differ from the first in their first id and have
as many ids: a space that becomes a token of its own is not the word's
form in the middle of a text. Both are encoded without special tokens.
The runner bans each sequence's last id where the output so far ends with
the rest (``runner.sampling.bad_words``).
"""

from __future__ import annotations

from collections.abc import Sequence

from checkpoint.tokenizer import Tokenizer
from ipc.errors import InvalidRequestError


def bad_words_token_ids(tokenizer: Tokenizer, words: Sequence[str]) -> list[list[int]]:
    """The token sequences of ``words``, in their order;
    ``InvalidRequestError`` for a word that has no token (empty or only
    whitespace)."""
    sequences = []
    for word in words:
        first = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not first:
            raise InvalidRequestError(f"bad word {word!r} has no tokens")
        sequences.append(first)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced[0] != first[0] and len(spaced) == len(first):
            sequences.append(spaced)
    return sequences
