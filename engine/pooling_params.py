"""``PoolingParams`` (vLLM's, for embeddings and classification) and the
embedding head the engine applies to a pooled vector (a classifier's head
is ``engine.classify_head``).

A pooling request runs its prompt and finishes without sampling: the
runner pools the final-normed hidden states (``runner.pooler``, by the
engine's pooling type) and sends the raw float32 vector, or for a
"token_embed" request one raw row per prompt token; the engine then
applies the request's ``dimensions`` (Matryoshka truncation: the first d
values) and, where ``normalize`` is on (the default), L2 normalization, in
that order, to each row, as vLLM's embedding heads do. ``dimensions`` is taken only
for a model that says it supports Matryoshka representations (config.json's
``is_matryoshka`` or ``matryoshka_dimensions``; with a list, only those),
as vLLM refuses it otherwise.
"""

from __future__ import annotations

import json
import os
from typing import Any

import msgspec
import numpy as np

from engine.request import ContextLengthError
from ipc.errors import InvalidRequestError


class PoolingParams(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM's pooling parameters. ``truncate_prompt_tokens``: keep the
    prompt's last k tokens (-1: ``max_model_len`` of them; None: all).
    Embeddings: ``dimensions`` truncates the embedding to its first d values
    (Matryoshka models only); ``normalize`` L2-normalizes it (None: the
    server's default, ``pooler_config``'s ``normalize``, else True).
    Classification: ``use_activation`` turns the logits into probabilities
    (None: ``pooler_config``'s, else True). ``task``: the pooling task
    ("embed", "classify", "token_embed", "token_classify"), which the
    engine sets (vLLM's internal field); each task refuses the parameters
    of the others, with vLLM's message."""

    truncate_prompt_tokens: int | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    task: str | None = None

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> PoolingParams:
        """From a message's or a caller's dict; a field of another type or
        name is an ``InvalidRequestError`` naming it."""
        unknown = sorted(set(fields) - set(cls.__struct_fields__))
        if unknown:
            raise InvalidRequestError(f"unknown pooling parameters {unknown}; embeddings take "
                                      f"{list(cls.__struct_fields__)}", param=unknown[0])
        try:
            return msgspec.convert(fields, cls)
        except msgspec.ValidationError as e:
            raise InvalidRequestError(f"pooling parameters: {e}") from None


class Matryoshka(msgspec.Struct, frozen=True):
    """What a model says of Matryoshka representations: ``supported`` at
    all, and ``dimensions`` (None: any)."""

    supported: bool = False
    dimensions: tuple[int, ...] | None = None

    @classmethod
    def of_model_dir(cls, model_dir: str) -> Matryoshka:
        """From config.json's ``is_matryoshka`` / ``matryoshka_dimensions``
        (vLLM reads the same keys); none where the file has neither."""
        path = os.path.join(model_dir, "config.json")
        if not os.path.isfile(path):
            return cls()
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        dims = config.get("matryoshka_dimensions")
        supported = bool(config.get("is_matryoshka")) or dims is not None
        return cls(supported, None if dims is None else tuple(int(d) for d in dims))


# The parameters each task takes, of those only one task takes (vLLM's).
TASK_PARAMETERS = {"embed": ("dimensions", "normalize"), "classify": ("use_activation",),
                   "token_embed": ("dimensions", "normalize"),
                   "token_classify": ("use_activation",)}
ALL_PARAMETERS = tuple(dict.fromkeys(n for names in TASK_PARAMETERS.values() for n in names))


def check_task_parameters(params: PoolingParams, task: str) -> PoolingParams:
    """``params`` for ``task``: its ``task`` set (one set to another task is
    refused), no parameter of another task given, ``truncate_prompt_tokens``
    None, -1 or k >= 1 (``SamplingParams``' rule: 0 or below -1 would keep
    the whole prompt or drop its start); vLLM's messages."""
    if params.task is not None and params.task != task:
        raise InvalidRequestError(f"You cannot overwrite self.task={params.task!r} with "
                                  f"task={task!r}!", param="task")
    k = params.truncate_prompt_tokens
    if k is not None and (type(k) is not int or (k < 1 and k != -1)):
        raise InvalidRequestError(f"truncate_prompt_tokens must be None, an int >= 1 or -1 "
                                  f"(max_model_len), got {k!r}", param="truncate_prompt_tokens")
    valid = list(TASK_PARAMETERS[task])
    invalid = [name for name in ALL_PARAMETERS
               if name not in valid and getattr(params, name) is not None]
    if invalid:
        raise InvalidRequestError(f"Task {task} only supports {valid} parameters, does not "
                                  f"support {invalid} parameters", param=invalid[0])
    return msgspec.structs.replace(params, task=task)


def resolved_params(params: PoolingParams, default_normalize: bool | None,
                    default_dimensions: int | None, matryoshka: Matryoshka,
                    model_name: str, task: str = "embed") -> PoolingParams:
    """``params`` of an embedding (``task`` "embed" or "token_embed",
    ``check_task_parameters``) with the
    server's defaults filled (``pooler_config``'s ``normalize`` and
    ``dimensions``; normalize True where neither says) and ``dimensions``
    checked against the model, with vLLM's messages."""
    params = check_task_parameters(params, task)
    normalize = params.normalize
    if normalize is None:
        normalize = True if default_normalize is None else default_normalize
    dimensions = params.dimensions if params.dimensions is not None else default_dimensions
    if dimensions is not None:
        if not matryoshka.supported:
            raise InvalidRequestError(
                f'Model "{model_name}" does not support matryoshka representation, changing '
                "output dimensions will lead to poor results.", param="dimensions")
        if matryoshka.dimensions is not None and dimensions not in matryoshka.dimensions:
            raise InvalidRequestError(
                f'Model "{model_name}" only supports {list(matryoshka.dimensions)} matryoshka '
                "dimensions, use other output dimensions will lead to poor results.",
                param="dimensions")
        if dimensions < 1:
            raise InvalidRequestError("Dimensions must be greater than 0", param="dimensions")
    return msgspec.structs.replace(params, normalize=normalize, dimensions=dimensions)


def check_pooling_prompt(prompt_token_ids: list[int], vocab_size: int, max_model_len: int,
                         num_blocks: int, block_size: int) -> None:
    """A pooling request's prompt can run: not empty, ids in the vocabulary,
    at most ``max_model_len`` tokens (no output token needs room; vLLM's
    message for embeddings), and KV blocks for it in the whole cache."""
    n = len(prompt_token_ids)
    if not n:
        raise InvalidRequestError("the input is empty: an embedding needs at least one token",
                                  param="input")
    bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(
            f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})",
            param="input")
    if n > max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {n} tokens in the input for embedding generation. Please reduce the "
            "length of the input.", "input")
    if -(-n // block_size) > num_blocks:
        raise InvalidRequestError(f"the input ({n} tokens) needs more KV cache blocks than the "
                                  f"cache has ({num_blocks} of {block_size} tokens)",
                                  param="input")


def embedding_of(pooled: bytes, params: PoolingParams, num_rows: int = 1) -> bytes:
    """The request's embedding from the runner's raw pooled rows (float32
    little-endian bytes, ``num_rows`` rows one after the other: one for
    "embed", one a prompt token for "token_embed"): each row's first
    ``dimensions`` values, then L2-normalized where ``normalize``; float32
    little-endian bytes again, row after row."""
    rows = np.frombuffer(pooled, dtype="<f4").reshape(num_rows, -1)
    if params.dimensions is not None:
        rows = rows[:, : params.dimensions]
    if params.normalize:
        norms = np.linalg.norm(rows.astype(np.float64), axis=1, keepdims=True)
        rows = rows / np.maximum(norms, 1e-12)
    return rows.astype("<f4").tobytes()
