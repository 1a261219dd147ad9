"""POST /pooling (vLLM's generic pooling API, on a pooling model).

The body is vLLM's, in one of its two forms: ``input`` (a text, texts,
token ids or lists of ids, read as /v1/embeddings reads it:
``serving_embedding.input_prompts``) or chat ``messages`` (rendered with
the model's chat template, or the server's ``--chat-template``, or the
request's own where the server trusts it, as /v1/chat/completions renders
them, but with ``add_generation_prompt`` off unless asked: a pooled prompt
is not answered). ``task`` is vLLM's pooling task; left out, the model's
own; another than the model's is refused with vLLM's message
(``engine.pooling_tasks``). Each prompt becomes one engine request of
that task (``embed_prompts``, the pooling routes' one way to the engine),
with ``truncate_prompt_tokens``, ``normalize`` (embed) and
``use_activation`` (classify); a parameter of the other task is refused
by the engine with vLLM's message. ``dimensions`` is refused, as vLLM's
/pooling refuses it ("dimensions is currently not supported").

The answer is vLLM's ``{"id": "pool-...", "object": "list", "created",
"model", "data": [{"index", "object": "pooling", "data"}], "usage"}``:
``data`` holds each prompt's output, in input order, the values
/v1/embeddings or /classify give for it (the embedding; the class
probabilities), as floats or, with ``encoding_format`` "base64", the base64
of their float32 little-endian bytes; ``usage`` counts the prompt tokens.
Every refusal is a 400 and nothing of the request keeps running.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

from checkpoint.chat_template import chat_prompt_ids
from engine.pooling_tasks import check_pooling_task
from serving.http.protocol import ChatMessage, FieldError
from serving.http.request_template import request_template
from serving.http.serving_embedding import (
    Int64,
    TruncatePromptTokens,
    embed_prompts,
    encoded_vector,
    input_prompts,
)
from serving.http.state import ServerState


class PoolingRequest(BaseModel):
    """vLLM's completion-style body (``input``) or chat-style one
    (``messages``), with the fields both take; other fields are ignored, as
    vLLM ignores them. ``add_special_tokens`` None: vLLM's default of the
    form (True for ``input``, False for ``messages``, whose template places
    the special tokens)."""

    model_config = ConfigDict(extra="ignore")

    input: str | list[str] | list[Int64] | list[list[Int64]] | None = None
    messages: list[ChatMessage] | None = None
    model: str | None = None
    task: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    add_special_tokens: bool | None = None
    priority: Int64 = 0
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


async def create_pooling(state: ServerState, request: PoolingRequest) -> Response:
    state.check_model(request.model)
    task = check_pooling_task(
        state.pooling_task if request.task is None else request.task, state.pooling_task, "task")
    if request.dimensions is not None:
        raise FieldError("dimensions", "dimensions is currently not supported")
    prompts = await _prompts(state, request)
    pooling = {"task": task, **{name: value for name, value in (
        ("truncate_prompt_tokens", request.truncate_prompt_tokens),
        ("normalize", request.normalize), ("use_activation", request.use_activation))
        if value is not None}}
    outputs, lengths = await embed_prompts(state, prompts, pooling, request.priority,
                                           state.lora_request(request.model))
    data = [{"index": i, "object": "pooling",
             "data": encoded_vector(output, request.encoding_format)}
            for i, output in enumerate(outputs)]
    num_tokens = sum(lengths)
    return JSONResponse({
        "id": f"pool-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
        "model": state.shown_model(request.model), "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens,
                  "completion_tokens": 0}})


async def _prompts(state: ServerState, request: PoolingRequest) -> list[list[int]]:
    """The body's prompts as token ids: its ``input``'s, or its one chat
    rendered (off the event loop); ``FieldError`` where it gives both or
    neither."""
    if (request.input is None) == (request.messages is None):
        raise FieldError("input", "give either input (texts or token ids) or messages (a "
                         "chat), not both")
    if request.messages is None:
        add = True if request.add_special_tokens is None else request.add_special_tokens
        return await input_prompts(state, request.input, add)
    template = request_template(request.chat_template, request.chat_template_kwargs,
                                state.trust_request_chat_template, state.chat_template)
    kwargs = {k: v for k, v in (request.chat_template_kwargs or {}).items()
              if k != "chat_template"}
    messages = [m.model_dump(exclude_none=True) for m in request.messages]
    _, ids = await asyncio.to_thread(
        chat_prompt_ids, state.tokenizer, messages, chat_template=template,
        add_generation_prompt=request.add_generation_prompt, extra=kwargs,
        continue_final_message=request.continue_final_message,
        add_special_tokens=bool(request.add_special_tokens))
    return [ids]
