"""The prompts of a pooling body (/pooling, /classify), in either of vLLM's
two forms: ``input`` (a text, texts, token ids or lists of ids, read as
/v1/embeddings reads it: ``serving_embedding.input_prompts``), one prompt
an item; or chat ``messages``, one prompt: the model's chat template (or
the server's ``--chat-template``, or the request's own where the server
trusts it: ``request_template``) rendered over them as
/v1/chat/completions renders them (``chat_template_kwargs`` giving the
same variables: ``template_variables``), but with ``add_generation_prompt``
off unless asked (a pooled prompt is not answered) and, by default, no
special tokens beyond those the template writes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from checkpoint.chat_template import chat_prompt_ids
from serving.http.protocol import ChatMessage, FieldError
from serving.http.request_template import request_template, template_variables
from serving.http.serving_embedding import Int64, input_prompts
from serving.http.state import ServerState


class PoolingPromptFields(BaseModel):
    """A pooling body's prompt fields, of both forms. ``add_special_tokens``
    None: vLLM's default of the form (True for ``input``, False for
    ``messages``, whose template places the special tokens)."""

    input: str | list[str] | list[Int64] | list[list[Int64]] | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


async def body_prompts(state: ServerState, body: PoolingPromptFields) -> list[list[int]]:
    """The body's prompts as token ids: its ``input``'s, or its one chat
    rendered (off the event loop); ``FieldError`` where it gives both or
    neither."""
    if (body.input is None) == (body.messages is None):
        raise FieldError("input", "give either input (texts or token ids) or messages (a "
                         "chat), not both")
    if body.messages is None:
        add = True if body.add_special_tokens is None else body.add_special_tokens
        return await input_prompts(state, body.input, add)
    template = request_template(body.chat_template, body.chat_template_kwargs,
                                state.trust_request_chat_template, state.chat_template)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    _, ids = await asyncio.to_thread(
        chat_prompt_ids, state.tokenizer, messages, chat_template=template,
        add_generation_prompt=body.add_generation_prompt,
        extra=template_variables(body.chat_template_kwargs),
        continue_final_message=body.continue_final_message,
        add_special_tokens=bool(body.add_special_tokens))
    return [ids]
