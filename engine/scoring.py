"""Scores of text pairs for an embedding model, as vLLM's score API gives
them: a pair's score is the cosine similarity of its two texts' embeddings.

The pairing rule (``score_pairs``) is vLLM's: one first text against one
second text, one first text against each of N second texts, or N first
texts against N second texts item by item; any other pair of lengths, or
an empty side, is the client's error with vLLM's message. The tokens a
score counts (``scored_token_ids``) are vLLM's too: the first text's, the
tokenizer's padding token where it has one, then the second text's, so a
1 to N request counts its first text once per pair. The Python API
(``LLM.score``) and the HTTP routes (/score, /rerank) share these rules.

A classifier of one label is a cross-encoder, as vLLM scores with one: a
pair is one prompt, the tokenizer's pair encoding of its two texts
(``Tokenizer.encode_pair``), classified; its score is the one logit
through the classifier's activation (the sigmoid, unless config.json
names another: ``engine.classify_head``), and it counts that prompt's
tokens. ``truncate_prompt_tokens``
cuts such a pair as the tokenizer cuts one (``pair_max_length``), never
the query's start. A classifier of more labels scores nothing
(``check_cross_encoder``, vLLM's message).
"""

from __future__ import annotations

import numpy as np

from ipc.errors import InvalidRequestError

# torch's ``cosine_similarity`` floor on each norm (vLLM scores with it): a
# zero vector scores 0 rather than NaN.
_NORM_FLOOR = 1e-8


def score_pairs(len_1: int, len_2: int, name_1: str = "text_1",
                name_2: str = "text_2") -> list[tuple[int, int]]:
    """The (first index, second index) of each score, in answer order:
    1 to 1, 1 to N or N to N; else an ``InvalidRequestError`` (vLLM's
    messages, checked in vLLM's order) naming the side at fault by
    ``name_1`` / ``name_2``, the fields the caller's request spells."""
    if len_1 > 1 and len_1 != len_2:
        raise InvalidRequestError("Input lengths must be either 1:1, 1:N or N:N", param=name_2)
    if len_1 == 0:
        raise InvalidRequestError("At least one text element must be given", param=name_1)
    if len_2 == 0:
        raise InvalidRequestError("At least one text_pair element must be given", param=name_2)
    return [(0 if len_1 == 1 else i, i) for i in range(len_2)]


def check_cross_encoder(num_labels: int) -> None:
    """A classifier scores pairs only with one label (vLLM's rule and message)."""
    if num_labels != 1:
        raise InvalidRequestError("Score API is only enabled for num_labels == 1.")


def pair_max_length(truncate_prompt_tokens: int | None, max_model_len: int) -> int | None:
    """The most ids a cross-encoder's pair prompt keeps
    (``Tokenizer.encode_pair``'s ``max_length``): ``truncate_prompt_tokens``,
    -1 being ``max_model_len``; None keeps the whole pair. vLLM cuts a pair
    in the tokenizer (``truncation=True``), so each text loses its end and
    the query, usually the shorter, stays whole. ``InvalidRequestError``
    for a value the pooling parameters refuse or above ``max_model_len``."""
    k = truncate_prompt_tokens
    if k is None:
        return None
    if type(k) is not int or (k < 1 and k != -1):
        raise InvalidRequestError(f"truncate_prompt_tokens must be None, an int >= 1 or -1 "
                                  f"(max_model_len), got {k!r}", param="truncate_prompt_tokens")
    if k > max_model_len:
        raise InvalidRequestError(f"truncate_prompt_tokens {k} is more than max_model_len "
                                  f"{max_model_len}, the longest prompt this model takes",
                                  param="truncate_prompt_tokens")
    return max_model_len if k == -1 else k


def cosine_similarity(embedding_1, embedding_2) -> float:
    """The cosine of two embeddings (float vectors of one length), computed
    in float64; each norm floored at 1e-8 as torch's is."""
    a = np.asarray(embedding_1, dtype=np.float64)
    b = np.asarray(embedding_2, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"embeddings of {a.size} and {b.size} values cannot be compared")
    norms = max(float(np.linalg.norm(a)), _NORM_FLOOR) * max(float(np.linalg.norm(b)),
                                                               _NORM_FLOOR)
    return float(np.dot(a, b) / norms)


def scored_token_ids(ids_1: list[int], ids_2: list[int], pad_token_id: int | None) -> list[int]:
    """The tokens one score counts: ``ids_1``, the padding token (where the
    tokenizer has one), ``ids_2``."""
    return [*ids_1, *(() if pad_token_id is None else (pad_token_id,)), *ids_2]
