"""vLLM's outputs of ``LLM.embed`` (``EmbeddingRequestOutput`` with
``.outputs.embedding``), of ``LLM.classify``
(``ClassificationRequestOutput`` with ``.outputs.probs``) and of
``LLM.encode`` (``PoolingRequestOutput`` with ``.outputs.data``, a tensor).
As in vLLM, the first two are ``PoolingRequestOutput``s of their own
outputs: one request record for the three."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch

Outputs = TypeVar("Outputs")


def _float32_values(data: bytes) -> np.ndarray:
    """The engine's float32 little-endian bytes as an array (read-only: it
    shares ``data``)."""
    return np.frombuffer(data, dtype="<f4")


@dataclass
class PoolingRequestOutput(Generic[Outputs]):
    """vLLM's: ``request_id``, ``outputs``, ``prompt_token_ids`` (after any
    truncation), ``num_cached_tokens`` (the prompt's prefix-cache hits) and
    ``finished``."""

    request_id: str
    outputs: Outputs
    prompt_token_ids: list[int]
    num_cached_tokens: int = 0
    finished: bool = True


@dataclass
class EmbeddingOutput:
    """One prompt's embedding: float values, ``dimensions`` long where the
    request asked, else the model's hidden size (L2-normalized unless the
    request turned ``normalize`` off)."""

    embedding: list[float]

    @classmethod
    def from_bytes(cls, data: bytes) -> EmbeddingOutput:
        """From the engine's float32 little-endian bytes."""
        return cls(_float32_values(data).tolist())

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


class EmbeddingRequestOutput(PoolingRequestOutput[EmbeddingOutput]):
    """vLLM's, of ``LLM.embed``."""


@dataclass
class ClassificationOutput:
    """One prompt's class probabilities, one per label in label order: the
    logits through the classifier's activation (``engine.classify_head``:
    softmax over the labels, the sigmoid of a single label's logit, each
    label's sigmoid for a multi-label classifier, the logits themselves
    for a regression head, or the one a sentence-transformers config
    names), or the raw logits where the request turned ``use_activation``
    off."""

    probs: list[float]

    @classmethod
    def from_bytes(cls, data: bytes) -> ClassificationOutput:
        """From the engine's float32 little-endian bytes."""
        return cls(_float32_values(data).tolist())

    @property
    def num_classes(self) -> int:
        return len(self.probs)


class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):
    """vLLM's, of ``LLM.classify``."""


@dataclass
class PoolingOutput:
    """One prompt's pooled output as ``LLM.encode`` gives it: ``data``, a
    float32 CPU tensor: 1-D, the embedding of the "embed" task or the class
    probabilities of the "classify" one (the values ``embed`` and
    ``classify`` give, with the same parameters); 2-D, one row per prompt
    token, for "token_embed" (each token's embedding, ``[n, hidden]``) and
    "token_classify" (each token's class probabilities, ``[n, num_labels]``),
    as vLLM's."""

    data: torch.Tensor

    @classmethod
    def from_bytes(cls, data: bytes, num_rows: int | None = None) -> PoolingOutput:
        """From the engine's float32 little-endian bytes (a copy: the tensor
        owns writable memory); ``num_rows`` rows where given (a token-level
        task's), else one vector."""
        values = _float32_values(data).astype(np.float32)
        return cls(torch.from_numpy(values if num_rows is None else values.reshape(num_rows, -1)))
