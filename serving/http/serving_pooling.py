"""POST /pooling (vLLM's generic pooling API, on a pooling model).

The body is vLLM's, in one of its two forms: ``input`` (texts or token
ids) or chat ``messages`` (``pooling_prompts.body_prompts``). ``task`` is vLLM's pooling task; left out, the model's
own; one the model does not serve (its own and that task's token-level
twin, "token_embed" or "token_classify") is refused with vLLM's message
(``engine.pooling_tasks``). Each prompt becomes one engine request of
that task (``embed_prompts``, the pooling routes' one way to the engine),
with ``truncate_prompt_tokens``, ``normalize`` (embed, token_embed) and
``use_activation`` (classify, token_classify); a parameter of another
task is refused by the engine with vLLM's message. ``dimensions`` is refused, as vLLM's
/pooling refuses it ("dimensions is currently not supported").

The answer is vLLM's ``{"id": "pool-...", "object": "list", "created",
"model", "data": [{"index", "object": "pooling", "data"}], "usage"}``:
``data`` holds each prompt's output, in input order, the values
/v1/embeddings or /classify give for it (the embedding; the class
probabilities), encoded as /v1/embeddings encodes its vectors
(``pooling_encoding``: ``encoding_format``, ``embed_dtype``,
``endianness``; "bytes" and "bytes_only" answer the bytes, not JSON);
a token-level task's output is one row a prompt token ("float": a list of
lists; otherwise the rows' bytes one after the other, shape ``[n, d]``), as
vLLM sends it; ``usage`` counts the prompt tokens.
Every refusal is a 400 and nothing of the request keeps running.
"""

from __future__ import annotations

import time
import uuid

from pydantic import ConfigDict
from starlette.responses import JSONResponse, Response

from engine.pooling_tasks import check_pooling_task, is_token_task
from serving.http.pooling_encoding import (
    EncodingFields,
    bytes_answer,
    encoded_vector,
    is_binary,
)
from serving.http.pooling_prompts import PoolingPromptFields, body_prompts
from serving.http.protocol import FieldError
from serving.http.serving_embedding import (
    Int64,
    TruncatePromptTokens,
    embed_prompts,
)
from serving.http.state import ServerState


class PoolingRequest(PoolingPromptFields, EncodingFields):
    """vLLM's completion-style body (``input``) or chat-style one
    (``messages``), with the fields both take; other fields are ignored, as
    vLLM ignores them."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    task: str | None = None
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    priority: Int64 = 0


async def create_pooling(state: ServerState, request: PoolingRequest) -> Response:
    state.check_model(request.model)
    task = check_pooling_task(
        state.pooling_task if request.task is None else request.task, state.pooling_task, "task")
    if request.dimensions is not None:
        raise FieldError("dimensions", "dimensions is currently not supported")
    prompts = await body_prompts(state, request)
    pooling = {"task": task, **{name: value for name, value in (
        ("truncate_prompt_tokens", request.truncate_prompt_tokens),
        ("normalize", request.normalize), ("use_activation", request.use_activation))
        if value is not None}}
    outputs, lengths = await embed_prompts(state, prompts, pooling, request.priority,
                                           state.lora_request(request.model))
    rows = [length if is_token_task(task) else None for length in lengths]
    num_tokens = sum(lengths)
    answer_id, created = f"pool-{uuid.uuid4().hex}", int(time.time())
    if is_binary(request):
        return bytes_answer(outputs, request, answer_id, created,
                            state.shown_model(request.model), num_tokens, rows)
    data = [{"index": i, "object": "pooling", "data": encoded_vector(output, request, n)}
            for i, (output, n) in enumerate(zip(outputs, rows))]
    return JSONResponse({
        "id": answer_id, "object": "list", "created": created,
        "model": state.shown_model(request.model), "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens,
                  "completion_tokens": 0}})

