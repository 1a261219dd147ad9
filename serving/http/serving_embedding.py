"""POST /v1/embeddings (OpenAI's, as vLLM serves it on a pooling model).

``input`` is a text, a list of texts, a list of token ids or a list of
lists of token ids; each becomes one embedding request to the engine
(texts tokenized here, off the event loop, as /v1/completions tokenizes
them). The answer is OpenAI's: ``data`` holds one ``{"object":
"embedding", "index", "embedding"}`` per input, in input order, the
embedding encoded as vLLM's ``encoding_format``, ``embed_dtype`` and
``endianness`` say (``pooling_encoding``: a list of floats by default,
"base64" the base64 of its bytes, which the ``openai`` client decodes as
float32; "bytes" and "bytes_only" answer the bytes themselves, not
JSON); ``usage`` counts the prompt tokens. ``dimensions`` (Matryoshka
models only) and vLLM's ``normalize`` and ``truncate_prompt_tokens`` go to
the engine's ``PoolingParams``; an input the engine refuses (empty, too
long) is a 400 and nothing of the request keeps running. A ``model`` that
names a LoRA module (``--lora-modules``) embeds with that adapter.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated

from pydantic import ConfigDict, Field
from starlette.responses import JSONResponse, Response

from ipc.engine_messages import Delta, EngineStopped, RequestAccepted, RequestError
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest
from serving.http.generation import EngineRefusal, RequestRefused
from serving.http.pooling_encoding import (
    EncodingFields,
    bytes_answer,
    encoded_vector,
    is_binary,
)
from serving.http.serving_completion import completion_prompts, has_text
from serving.http.state import ServerState
from serving.protocol_core import EngineStoppedError

# Every int of a pooling body travels to the engine as a signed 64-bit value:
# a larger one is a 400 naming its field, not a failure to encode it (500).
Int64 = Annotated[int, Field(ge=-(1 << 63), le=(1 << 63) - 1)]
# ``truncate_prompt_tokens`` of the pooling bodies: None, -1 or k >= 1 (the
# engine refuses 0 and k past max_model_len with its own message).
TruncatePromptTokens = Annotated[int, Field(ge=-1, le=(1 << 63) - 1)]


class EmbeddingRequest(EncodingFields):
    """OpenAI's body, with vLLM's extra fields (``truncate_prompt_tokens``,
    ``normalize``, ``add_special_tokens``, ``priority``, and the encoding
    fields ``embed_dtype`` and ``endianness``); others are ignored, as vLLM
    ignores them."""

    model_config = ConfigDict(extra="ignore")

    input: str | list[str] | list[Int64] | list[list[Int64]]
    model: str | None = None
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    normalize: bool | None = None
    add_special_tokens: bool = True
    priority: Int64 = 0


async def create_embedding(state: ServerState, request: EmbeddingRequest) -> Response:
    state.check_model(request.model)
    prompts = await input_prompts(state, request.input, request.add_special_tokens)
    pooling = {name: value for name, value in (
        ("dimensions", request.dimensions), ("normalize", request.normalize),
        ("truncate_prompt_tokens", request.truncate_prompt_tokens)) if value is not None}
    embeddings, lengths = await embed_prompts(state, prompts, pooling, request.priority,
                                              state.lora_request(request.model))
    num_tokens = sum(lengths)
    answer_id, created = f"embd-{uuid.uuid4().hex}", int(time.time())
    if is_binary(request):
        return bytes_answer(embeddings, request, answer_id, created,
                            state.shown_model(request.model), num_tokens)
    data = [{"object": "embedding", "index": i, "embedding": encoded_vector(e, request)}
            for i, e in enumerate(embeddings)]
    return JSONResponse({
        "id": answer_id, "object": "list", "created": created,
        "model": state.shown_model(request.model), "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens,
                  "completion_tokens": 0}})


async def input_prompts(state: ServerState, given, add_special_tokens: bool) -> list[list[int]]:
    """A pooling body's ``input`` (a text, texts, ids or lists of ids) as
    token ids, texts tokenized off the event loop; ``InvalidRequestError``
    for an empty input or an empty item."""
    if given == [] or given == "" or any(item == "" or item == [] for item in given
                                         if isinstance(given, list)):
        raise InvalidRequestError("the input is empty: each input needs at least one token",
                                  param="input")
    if has_text(given):
        return await asyncio.to_thread(completion_prompts, state, given, add_special_tokens)
    return completion_prompts(state, given)


async def embed_prompts(state: ServerState, prompts: list[list[int]], pooling: dict,
                        priority: int, lora_request: LoRARequest | None
                        ) -> tuple[list[bytes], list[int]]:
    """Submit one embedding request a prompt (each with ``lora_request``,
    the adapter the request's ``model`` names) and wait for every one: their
    embeddings and their prompt lengths (as the engine took them, truncated),
    both in prompt order. A refusal aborts the others and is raised. The
    pooling routes' one way to the engine (/v1/embeddings, /classify,
    /pooling, /score, /rerank). Each
    engine request that ends counts in the metrics (``Metrics.finished``),
    as a generation's does and as vLLM counts a pooling request."""
    link, queue, arrival = state.link, asyncio.Queue(), time.monotonic()
    ids = [link.new_id() for _ in prompts]
    for request_id, prompt in zip(ids, prompts):
        link.submit(request_id, prompt, {}, queue, priority, pooling_params=pooling,
                    lora_request=lora_request)
    live, embeddings, lengths = set(ids), {}, {}
    try:
        while live:
            item = await queue.get()
            if isinstance(item, EngineStopped):
                raise EngineStoppedError(item.reason)
            if isinstance(item, RequestAccepted):
                lengths[item.request_id] = len(item.prompt_token_ids)
            elif isinstance(item, RequestError):
                live.discard(item.request_id)
                link.forget(item.request_id)
                if item.invalid_request:
                    raise RequestRefused(item.error, item.code, item.param)
                raise EngineRefusal(f"the engine refused request {item.request_id!r}: "
                                    f"{item.error}")
            elif isinstance(item, Delta) and item.finished:
                live.discard(item.request_id)
                link.forget(item.request_id)
                state.metrics.finished(item.finish_reason, time.monotonic() - arrival)
                if item.embedding is None:
                    raise RuntimeError(f"embedding request {item.request_id!r} ended "
                                       f"{item.finish_reason!r} without an embedding")
                embeddings[item.request_id] = item.embedding
    finally:
        for request_id in live:
            link.abort(request_id)
            state.metrics.finished("abort", time.monotonic() - arrival)
    return [embeddings[r] for r in ids], [lengths[r] for r in ids]

