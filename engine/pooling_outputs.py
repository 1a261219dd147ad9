"""vLLM's outputs of ``LLM.embed`` (``EmbeddingRequestOutput`` with
``.outputs.embedding``), of ``LLM.classify``
(``ClassificationRequestOutput`` with ``.outputs.probs``) and of
``LLM.encode`` (``PoolingRequestOutput`` with ``.outputs.data``, a tensor)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class EmbeddingOutput:
    """One prompt's embedding: float values, ``dimensions`` long where the
    request asked, else the model's hidden size (L2-normalized unless the
    request turned ``normalize`` off)."""

    embedding: list[float]

    @classmethod
    def from_bytes(cls, data: bytes) -> EmbeddingOutput:
        """From the engine's float32 little-endian bytes."""
        return cls(np.frombuffer(data, dtype="<f4").tolist())

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """vLLM's: ``request_id``, ``prompt_token_ids`` (after any truncation),
    ``finished`` and ``outputs``."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True


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
        return cls(np.frombuffer(data, dtype="<f4").tolist())

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    """vLLM's: ``request_id``, ``prompt_token_ids`` (after any truncation),
    ``finished`` and ``outputs``."""

    request_id: str
    outputs: ClassificationOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class PoolingOutput:
    """One prompt's pooled output as ``LLM.encode`` gives it: ``data``, a
    1-D float32 CPU tensor, the embedding of the "embed" task or the class
    probabilities of the "classify" one (the values ``embed`` and
    ``classify`` give, with the same parameters)."""

    data: torch.Tensor

    @classmethod
    def from_bytes(cls, data: bytes) -> PoolingOutput:
        """From the engine's float32 little-endian bytes (a copy: the tensor
        owns writable memory)."""
        return cls(torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32)))


@dataclass
class PoolingRequestOutput:
    """vLLM's: ``request_id``, ``outputs``, ``prompt_token_ids`` (after any
    truncation), ``num_cached_tokens`` (the prompt's prefix-cache hits) and
    ``finished``."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    num_cached_tokens: int = 0
    finished: bool = True
