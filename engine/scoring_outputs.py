"""vLLM's outputs of ``LLM.score``: ``ScoringRequestOutput`` with
``.outputs.score``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ScoringOutput:
    """One pair's score: an embedding model's, the cosine similarity of its
    two embeddings, in [-1, 1]; a cross-encoder's, its one logit through
    the classifier's activation (``engine.classify_head``)."""

    score: float


@dataclass
class ScoringRequestOutput:
    """vLLM's: ``request_id`` (the two embedding requests' ids joined by
    "_"), ``outputs``, ``prompt_token_ids`` (the first text's tokens, the
    padding token where the tokenizer has one, the second text's; after any
    truncation) and ``finished``."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True
