"""POST /score and /v1/score (vLLM's score API, on an embedding model).

A request gives two sides, each a text or a list of texts: ``text_1`` and
``text_2`` (vLLM's first names), or ``queries`` and ``documents``, or
``queries`` and ``items``, or ``data_1`` and ``data_2`` (vLLM's later
spellings of the same request).
The sides pair 1 to 1, 1 to N or N to N (``engine.scoring.score_pairs``);
each text is tokenized here (off the event loop, with the tokenizer's
special tokens) and embedded once, through ``embed_prompts`` as
/v1/embeddings embeds, so each counts in the metrics as an embedding does;
a pair's score is the cosine similarity of its two embeddings. The answer
is vLLM's: ``id`` "score-...", ``object`` "list", ``data`` one ``{"index",
"object": "score", "score"}`` a pair in pair order, ``usage`` counting each
pair's tokens as ``engine.scoring.scored_token_ids`` says.
``truncate_prompt_tokens`` truncates each text, as /v1/embeddings does; a
text the engine refuses (too long) is a 400 and nothing of the request
keeps running. A ``model`` that names a LoRA module scores with it.
``pair_scores`` is the scoring both this route and /rerank run. On a
classifier of one label (a cross-encoder, ``engine.scoring``) a pair is one
prompt, the tokenizer's pair encoding of its texts, and its score the one
logit through the classifier's activation (``engine.classify_head``), or
the logit itself where ``use_activation`` is false (vLLM's field; left
out, the pooler config's default); a classifier of more labels is a 400.
An embedding model's cosine similarity is the same with its embeddings
normalized or not, so ``use_activation`` leaves it as it is.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator
from starlette.responses import JSONResponse, Response

from engine.scoring import check_cross_encoder, cosine_similarity, pair_max_length, score_pairs
from ipc.errors import InvalidRequestError
from serving.http.serving_embedding import Int64, TruncatePromptTokens, embed_prompts
from serving.http.state import ServerState

# The field pairs a score request may name its two sides by, vLLM's.
SIDE_NAMES = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
              ("data_1", "data_2"))


class ScoreRequest(BaseModel):
    """vLLM's body: one pair of ``SIDE_NAMES`` (each a text or a list of
    texts) and no field of another pair, ``truncate_prompt_tokens`` (None,
    -1 or k >= 1), ``priority``, ``use_activation``; other fields are
    ignored, as vLLM ignores them."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    items: str | list[str] | None = None
    data_1: str | list[str] | None = None
    data_2: str | list[str] | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    priority: Int64 = 0
    use_activation: bool | None = None

    @model_validator(mode="after")
    def _one_pair_of_sides(self) -> ScoreRequest:
        given = {name for names in SIDE_NAMES for name in names
                 if getattr(self, name) is not None}
        whole = [names for names in SIDE_NAMES if given.issuperset(names)]
        if len(whole) != 1 or given != set(whole[0]):
            raise ValueError("a score request gives text_1 and text_2 (or queries and "
                             "documents, queries and items, or data_1 and data_2), one "
                             "pair of them")
        return self

    def sides(self) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
        """Each side's field name and texts, a lone text as a list of one."""
        names = next(n for n in SIDE_NAMES if all(getattr(self, name) is not None
                                                  for name in n))
        return tuple((name, _as_list(getattr(self, name))) for name in names)


def _as_list(texts: str | list[str]) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


async def create_score(state: ServerState, request: ScoreRequest) -> Response:
    state.check_model(request.model)
    (name_1, texts_1), (name_2, texts_2) = request.sides()
    scores, pair_tokens = await pair_scores(state, (name_1, texts_1), (name_2, texts_2),
                                            request.model, request.truncate_prompt_tokens,
                                            request.priority, request.use_activation)
    num_tokens = sum(pair_tokens)
    return JSONResponse({
        "id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
        "model": state.shown_model(request.model),
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens,
                  "completion_tokens": 0}})


async def pair_scores(state: ServerState, side_1: tuple[str, list[str]],
                      side_2: tuple[str, list[str]], model: str | None,
                      truncate_prompt_tokens: int | None, priority: int,
                      use_activation: bool | None = None) -> tuple[list[float], list[int]]:
    """Each pair's score and the tokens it counts, in pair order. A side is
    (its field's name, its texts); the pairing is checked before anything
    is tokenized, and an empty text is refused naming its field, before
    anything reaches the engine. ``use_activation`` (None: the model's
    default) applies to a cross-encoder's scores only (see the module)."""
    (name_1, texts_1), (name_2, texts_2) = side_1, side_2
    pairs = score_pairs(len(texts_1), len(texts_2), name_1, name_2)
    for name, texts in (side_1, side_2):
        for i, text in enumerate(texts):
            if not text:
                raise InvalidRequestError(f"{name}[{i}] is empty: each text needs at least "
                                          "one token", param=name)
    if state.pooling_task == "classify":
        return await _cross_encoding_scores(state, texts_1, texts_2, pairs, model,
                                            truncate_prompt_tokens, priority, use_activation)
    prompts = await asyncio.to_thread(
        lambda: [state.tokenizer.encode(t) for t in (*texts_1, *texts_2)])
    pooling = ({} if truncate_prompt_tokens is None
               else {"truncate_prompt_tokens": truncate_prompt_tokens})
    embeddings, lengths = await embed_prompts(state, prompts, pooling, priority,
                                              state.lora_request(model))
    pad = 0 if state.tokenizer.pad_token_id is None else 1
    second = len(texts_1)
    scores = [cosine_similarity(_floats(embeddings[i]), _floats(embeddings[second + j]))
              for i, j in pairs]
    return scores, [lengths[i] + pad + lengths[second + j] for i, j in pairs]


async def _cross_encoding_scores(state: ServerState, texts_1: list[str], texts_2: list[str],
                                 pairs: list[tuple[int, int]], model: str | None,
                                 truncate_prompt_tokens: int | None, priority: int,
                                 use_activation: bool | None) -> tuple[list[float], list[int]]:
    """``pair_scores`` on a classifier of one label (a cross-encoder,
    ``engine.scoring``): each pair one prompt (``Tokenizer.encode_pair``),
    classified with ``use_activation`` where given; its score the one
    output, its tokens the prompt's."""
    check_cross_encoder(len(state.labels))
    max_length = pair_max_length(truncate_prompt_tokens, state.max_model_len)
    prompts = await asyncio.to_thread(
        lambda: [state.tokenizer.encode_pair(texts_1[i], texts_2[j], max_length)
                 for i, j in pairs])
    pooling = {"task": "classify",
               **({} if use_activation is None else {"use_activation": use_activation})}
    outputs, lengths = await embed_prompts(state, prompts, pooling, priority,
                                           state.lora_request(model))
    return [float(_floats(o)[0]) for o in outputs], lengths


def _floats(embedding: bytes) -> np.ndarray:
    """The engine's float32 little-endian bytes as a vector."""
    return np.frombuffer(embedding, dtype="<f4")
