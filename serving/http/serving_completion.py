"""POST /v1/completions: prompts in, text completions out (whole, or as
server-sent events).

A text prompt is tokenized here exactly as the engine tokenizes text (the
same ``Tokenizer.encode``), so the answer equals ``LLM.generate``'s for the
same prompt and sampling; token-id prompts go through unchanged. The
default ``max_tokens`` is 16, as in OpenAI's API.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from serving.http.generation import ChoiceEvent, Generation
from serving.http.protocol import CompletionRequest
from serving.http.sampling import choice_params
from serving.http.state import ServerState
from serving.http.streaming import event_lines, respond

DEFAULT_MAX_TOKENS = 16


def completion_prompts(state: ServerState, prompt) -> list[list[int]]:
    """The request's prompts as token ids; ``ValueError`` for an empty one."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise ValueError("the prompt is empty")
    if all(isinstance(t, int) for t in prompt):
        return [list(prompt)]
    out = []
    for p in prompt:
        if isinstance(p, str):
            if not p:
                raise ValueError("the prompt is empty")
            out.append(state.tokenizer.encode(p))
        else:
            out.append(list(p))  # the engine refuses an empty or out-of-vocabulary one
    return out


async def create_completion(state: ServerState, request: CompletionRequest,
                            raw: Request) -> Response:
    state.check_model(request.model)
    request.check_supported()
    # Tokenizing a long text takes a while: off the event loop, so other
    # requests and streams go on meanwhile.
    prompts = await asyncio.to_thread(completion_prompts, state, request.prompt)
    max_tokens = request.max_tokens if request.max_tokens is not None else DEFAULT_MAX_TOKENS
    params = choice_params(request, max_tokens, request.logprobs)
    generation = Generation(state.link, state.metrics)
    await generation.start(prompts, params, request.stop_strings())
    response_id = f"cmpl-{secrets.token_hex(12)}"
    return await respond(raw, generation, request.stream,
                         lambda: _stream(state, request, generation, response_id),
                         lambda: _collect(state, request, generation, response_id))


def _head(state: ServerState, response_id: str) -> dict:
    return {"id": response_id, "object": "text_completion", "created": int(time.time()),
            "model": state.model_name}


class _Logprobs:
    """Accumulates one choice's logprobs (and its text offset)."""

    def __init__(self, state: ServerState, num_top: int | None) -> None:
        self.state, self.num_top, self.offset = state, num_top, 0

    def of(self, event: ChoiceEvent) -> dict | None:
        if self.num_top is None or event.logprobs is None:
            return None
        out = self.state.logprobs.completion(event.token_ids, event.logprobs, self.num_top,
                                             self.offset)
        self.offset += len(event.text)
        return out


async def _collect(state: ServerState, request: CompletionRequest, generation: Generation,
                   response_id: str) -> dict:
    num_choices = len(generation.choices)
    texts = [""] * num_choices
    reasons: list[str | None] = [None] * num_choices
    logprobs = [_Logprobs(state, request.logprobs) for _ in range(num_choices)]
    merged: list[dict | None] = [None] * num_choices
    async for event in generation.events():
        texts[event.index] += event.text
        reasons[event.index] = event.finish_reason or reasons[event.index]
        if (part := logprobs[event.index].of(event)) is not None:
            merged[event.index] = _extend(merged[event.index], part)
    if request.logprobs is not None:
        merged = [m or {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                        "text_offset": []} for m in merged]
    choices = [{"index": i, "text": texts[i], "logprobs": merged[i],
                "finish_reason": reasons[i]} for i in range(num_choices)]
    return {**_head(state, response_id), "choices": choices, "usage": generation.usage()}


def _extend(into: dict | None, part: dict) -> dict:
    if into is None:
        return part
    for key, values in part.items():
        into[key].extend(values)
    return into


def _stream(state: ServerState, request: CompletionRequest, generation: Generation,
            response_id: str) -> AsyncIterator[str]:
    head = _head(state, response_id)
    return event_lines(_chunks(state, request, generation, head), head, generation,
                       request.include_usage)


async def _chunks(state: ServerState, request: CompletionRequest, generation: Generation,
                  head: dict) -> AsyncIterator[dict]:
    logprobs = [_Logprobs(state, request.logprobs) for _ in range(len(generation.choices))]
    async for event in generation.events():
        lp = logprobs[event.index].of(event)
        if not event.text and lp is None and event.finish_reason is None:
            continue  # tokens whose text is held back (an incomplete character)
        choice = {"index": event.index, "text": event.text, "logprobs": lp,
                  "finish_reason": event.finish_reason}
        yield {**head, "choices": [choice]}
