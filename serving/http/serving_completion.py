"""POST /v1/completions: prompts in, text completions out (whole, or as
server-sent events).

A text prompt is tokenized here exactly as the engine tokenizes text (the
same ``Tokenizer.encode``), so the answer equals ``LLM.generate``'s for the
same prompt and sampling; token-id prompts go through unchanged. The
default ``max_tokens`` is 16, as in OpenAI's API, where the field is left
out; an explicit null is what the context leaves (vLLM's); 0 is accepted with
``echo`` (the prompt alone, with its logprobs: what evaluation harnesses
ask for). ``echo`` (``serving.http.echo``) puts each prompt before
its choices' text; ``prompt_logprobs`` (vLLM's extra field) is answered
on each choice in vLLM's shape. With ``return_token_ids`` (vLLM's) each
choice also has ``token_ids`` and ``prompt_token_ids``
(``serving.http.token_ids``). ``use_beam_search`` (vLLM's) answers
with each prompt's ``n`` best sequences instead (``serving.http.beam_search``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from engine.sampling_params import truncated_prompt
from ipc import trace
from ipc.errors import InvalidRequestError
from ipc.messages import WHOLE_VOCAB
from serving.http.beam_search import check_beam_fields, respond_with_beams
from serving.http.echo import EchoedPrompt, echoed_prompts
from serving.http.generation import ChoiceEvent, Generation
from serving.http.logprobs import TextOffsets
from serving.http.protocol import CompletionRequest, FieldError
from serving.http.response_ids import response_id
from serving.http.sampling import capped_max_tokens, check_logprobs, choice_params
from serving.http.state import ServerState
from serving.http.stream_interval import grouped, interval_of
from serving.http.streaming import event_lines, respond
from serving.http.token_ids import ReturnedTokenIds

DEFAULT_MAX_TOKENS = 16


def completion_prompts(state: ServerState, prompt,
                       add_special_tokens: bool = True) -> list[list[int]]:
    """The request's prompts as token ids (texts with the tokenizer's BOS
    where ``add_special_tokens``); ``InvalidRequestError`` for an empty one.

    ``prompt`` is a validated ``CompletionRequest.prompt``: a text, or a list
    whose items are all texts, all token ids or all lists of ids, so its
    first item tells which."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise InvalidRequestError("the prompt is empty")
    if isinstance(prompt[0], int):
        return [list(prompt)]
    out = []
    for p in prompt:
        if isinstance(p, str):
            if not p:
                raise InvalidRequestError("the prompt is empty")
            out.append(state.tokenizer.encode(p, add_special_tokens))
        else:
            out.append(list(p))  # the engine refuses an empty or out-of-vocabulary one
    return out


def has_text(prompt) -> bool:
    """Whether a validated ``CompletionRequest.prompt`` holds any text to
    tokenize (a list's items are all of one kind)."""
    return isinstance(prompt, str) or (bool(prompt) and isinstance(prompt[0], str))


def _engine_prompt_logprobs(request: CompletionRequest) -> int | None:
    """What the engine computes: the request's ``prompt_logprobs`` and, for
    ``echo`` with ``logprobs``, at least that many (-1, the whole
    vocabulary, is the most)."""
    wanted = [k for k in (request.prompt_logprobs,
                          request.logprobs if request.echo else None) if k is not None]
    if WHOLE_VOCAB in wanted:
        return WHOLE_VOCAB
    return max(wanted) if wanted else None


async def create_completion(state: ServerState, request: CompletionRequest,
                            raw: Request) -> Response:
    if trace.enabled:
        trace.mark("http_handler")
    state.check_model(request.model)
    request.check_supported()
    if request.use_beam_search:
        check_beam_fields(request, "prompt")
    max_tokens = request.max_tokens
    if max_tokens is None and "max_tokens" not in request.model_fields_set:
        max_tokens = DEFAULT_MAX_TOKENS
    if max_tokens is not None and max_tokens < 1 and not (max_tokens == 0 and request.echo):
        raise InvalidRequestError("max_tokens must be >= 1 (0 only with echo: the prompt "
                                  "alone)")
    listed = request.listed_logprobs(request.logprobs is not None, "logprobs set")
    if listed and request.echo and max_tokens == 0:
        raise FieldError("logprob_token_ids", "logprob_token_ids needs generated tokens: "
                         "echo with max_tokens 0 generates none")
    check_logprobs(state.max_logprobs, state.vocab_size,
                   logprobs=None if listed else request.logprobs,
                   prompt_logprobs=request.prompt_logprobs)
    # Tokenizing a long text takes a while: off the event loop, so other
    # requests and streams go on meanwhile. Token ids need no thread (the
    # hop to one and back would be the slowest part of their trip).
    if has_text(request.prompt):
        prompts = await asyncio.to_thread(completion_prompts, state, request.prompt,
                                          request.add_special_tokens)
    else:
        prompts = completion_prompts(state, request.prompt)
    if trace.enabled:
        trace.mark("http_tokenized")
    given = request.prompt
    if request.truncate_prompt_tokens is not None:  # echoed as the engine sees them
        prompts = [truncated_prompt(p, request.truncate_prompt_tokens, state.max_model_len,
                                    request.truncation_side) for p in prompts]
        given = prompts
    # Each prompt's cap, as its own room limits it.
    engine_max = [capped_max_tokens(None if max_tokens is None else max(max_tokens, 1),
                                    state.sampling_defaults, state.max_model_len - len(p))
                  for p in prompts]
    if request.use_beam_search:  # the context's end, where a cap leaves it open
        steps = max((m for m in engine_max if m is not None), default=state.max_model_len)
        return await respond_with_beams(
            state, raw, request, prompts, steps,
            _head(state, request, response_id("cmpl-", raw, request)),
            lambda p, text, tokens, _in_reasoning: {
                "text": text, "logprobs": None,
                **({"prompt_token_ids": prompts[p], "token_ids": tokens}
                   if request.return_token_ids else {})})
    params = choice_params(request, engine_max[0], None if listed else request.logprobs,
                           _engine_prompt_logprobs(request), defaults=state.sampling_defaults)
    echoes = echoed_prompts(state.tokenizer, given, prompts) if request.echo else None
    generation = Generation(state.link, state.metrics, discard_output=max_tokens == 0)
    await generation.start(prompts, params, request.stop_strings(), request.priority,
                           engine_max, cache_salt=request.cache_salt,
                           lora_request=state.lora_request(request.model))
    answer_id = response_id("cmpl-", raw, request)
    return await respond(raw, generation, request.stream,
                         lambda: _stream(state, request, generation, answer_id, echoes),
                         lambda: _collect(state, request, generation, answer_id, echoes))


def _head(state: ServerState, request: CompletionRequest, answer_id: str) -> dict:
    return {"id": answer_id, "object": "text_completion", "created": int(time.time()),
            "model": state.shown_model(request.model)}


class _Choice:
    """One choice's answer in the making: its echoed prompt (text and
    logprobs, once), then its events' text and logprobs, with the text
    offsets running over the tokens of both."""

    def __init__(self, state: ServerState, request: CompletionRequest,
                 echo: EchoedPrompt | None) -> None:
        self.state, self.request, self.echo = state, request, echo
        self.num_top = request.logprobs
        self.offsets = TextOffsets()
        self.started = False

    def text_of(self, event: ChoiceEvent) -> str:
        if self.started or self.echo is None:
            return event.text
        return self.echo.text + event.text

    def logprobs_of(self, event: ChoiceEvent) -> dict | None:
        if self.num_top is None:
            return None
        part = None
        if not self.started and self.echo is not None:
            part = self.echo.logprobs(self.state.logprobs, event.prompt_logprobs, self.num_top,
                                      self.offsets, self.request.return_tokens_as_token_ids)
        if event.logprobs is not None:
            out = self.state.logprobs.completion(event.token_ids, event.logprobs, self.num_top,
                                                 self.offsets,
                                                 self.request.return_tokens_as_token_ids,
                                                 listed=bool(self.request.logprob_token_ids))
            part = out if part is None else _extend(part, out)
        return part

    def prompt_logprobs_of(self, event: ChoiceEvent, prompt_ids: list[int]) -> list | None:
        if self.request.prompt_logprobs is None or event.prompt_logprobs is None:
            return None
        return self.state.logprobs.prompt_logprobs(prompt_ids, event.prompt_logprobs,
                                                   self.request.prompt_logprobs)

    def fields(self, event: ChoiceEvent, prompt_ids: list[int]) -> dict:
        """The choice's text, logprobs and prompt logprobs for ``event``
        (the first event carries the echo and the prompt logprobs)."""
        out = {"text": self.text_of(event), "logprobs": self.logprobs_of(event),
               "prompt_logprobs": self.prompt_logprobs_of(event, prompt_ids)}
        self.started = True
        return out


def _choices(state: ServerState, request: CompletionRequest, generation: Generation,
             echoes: list[EchoedPrompt] | None) -> list[_Choice]:
    per_prompt = len(generation.choices) // max(1, len(echoes or [None]))
    return [_Choice(state, request, echoes[i // per_prompt] if echoes else None)
            for i in range(len(generation.choices))]


async def _collect(state: ServerState, request: CompletionRequest, generation: Generation,
                   answer_id: str, echoes: list[EchoedPrompt] | None) -> dict:
    num_choices = len(generation.choices)
    builders = _choices(state, request, generation, echoes)
    prompt_ids = generation.prompts_by_choice()
    ids = _returned_ids(request, generation)
    texts: list[list[str]] = [[] for _ in range(num_choices)]  # each choice's pieces, joined once
    reasons: list[str | None] = [None] * num_choices
    stop_reasons: list[int | str | None] = [None] * num_choices
    merged: list[dict | None] = [None] * num_choices
    prompt_lps: list[list | None] = [None] * num_choices
    async for event in generation.events():
        i = event.index
        fields = builders[i].fields(event, prompt_ids[i])
        texts[i].append(fields["text"])
        ids.add(event)
        if event.finish_reason is not None:
            reasons[i], stop_reasons[i] = event.finish_reason, event.stop_reason
        if fields["logprobs"] is not None:
            merged[i] = _extend(merged[i], fields["logprobs"])
        prompt_lps[i] = fields["prompt_logprobs"] or prompt_lps[i]
    if request.logprobs is not None:
        merged = [m or {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                        "text_offset": []} for m in merged]
    choices = [{"index": i, "text": "".join(texts[i]), "logprobs": merged[i],
                "finish_reason": reasons[i], "stop_reason": stop_reasons[i]}
               for i in range(num_choices)]
    if request.prompt_logprobs is not None:
        for choice, lps in zip(choices, prompt_lps):
            choice["prompt_logprobs"] = lps
    if request.return_token_ids:
        for i, choice in enumerate(choices):
            choice.update(prompt_token_ids=ids.prompt_of(i), token_ids=ids.of_choice(i))
    return {**_head(state, request, answer_id), "choices": choices,
            "usage": generation.usage()}


def _returned_ids(request: CompletionRequest, generation: Generation) -> ReturnedTokenIds:
    return ReturnedTokenIds(generation, prompts=request.return_token_ids,
                            outputs=request.return_token_ids)


def _extend(into: dict | None, part: dict) -> dict:
    if into is None:
        return part
    for key, values in part.items():
        into[key].extend(values)
    return into


def _stream(state: ServerState, request: CompletionRequest, generation: Generation,
            answer_id: str, echoes: list[EchoedPrompt] | None) -> AsyncIterator[str]:
    head = _head(state, request, answer_id)
    return event_lines(_chunks(state, request, generation, head, echoes), head, generation,
                       request.include_usage, request.continuous_usage)


async def _chunks(state: ServerState, request: CompletionRequest, generation: Generation,
                  head: dict, echoes: list[EchoedPrompt] | None) -> AsyncIterator[dict]:
    builders = _choices(state, request, generation, echoes)
    prompt_ids = generation.prompts_by_choice()
    ids = _returned_ids(request, generation)
    async for event in grouped(generation.events(),
                                 interval_of(state.stream_interval, request.stream_interval)):
        fields = builders[event.index].fields(event, prompt_ids[event.index])
        if (not fields["text"] and fields["logprobs"] is None and event.finish_reason is None
                and not ids.needs_chunk(event)):
            continue  # tokens whose text is held back (an incomplete character)
        choice = {"index": event.index, "text": fields["text"], "logprobs": fields["logprobs"],
                  "finish_reason": event.finish_reason, "stop_reason": event.stop_reason}
        if request.prompt_logprobs is not None and fields["prompt_logprobs"] is not None:
            choice["prompt_logprobs"] = fields["prompt_logprobs"]
        if (prompt := ids.first_prompt_of(event.index)) is not None:
            choice["prompt_token_ids"] = prompt
        choice.update(ids.chunk_fields(event))
        yield {**head, "choices": [choice]}
