"""``use_beam_search`` (vLLM's) on /v1/completions and /v1/chat/completions:
each prompt's ``n`` best sequences by beam search (``engine.beam_search``:
the rule and the score), each a choice.

The search runs here, in the front end, over the engine link: each step is
one ``Generation`` of one-token requests, one a live beam, asking for
``2 * n`` logprobs (the engine's prefix cache holds each beam's earlier
tokens: every step's requests share one reply queue, which keeps them on
one replica of a data-parallel link); ``BeamSearch`` extends, ranks and
ends the beams. ``n`` is the
beam width; ``length_penalty`` is vLLM's field; ``temperature`` (0 where
left out) draws the token each step samples beside the top candidates; an
ended sequence keeps its end-of-sequence token only with
``include_stop_str_in_output``, as in vLLM's server. Each sequence's text
is the tokenizer's ``decode`` of its tokens with ``skip_special_tokens``,
as vLLM's server decodes it; ``spaces_between_special_tokens`` is taken
and changes nothing there, as in vLLM (a fast tokenizer's decode has no
such option). With ``return_token_ids`` each choice carries its
sequence's ids (and the prompt's, where the route puts them). The answer comes whole: a field that shapes tokens as they
come or asks for what a beam does not carry (``stream``, logprobs, stop
strings, penalties, structured outputs, tools, ...) is refused beside
``use_beam_search`` rather than ignored (``check_beam_fields``). Its usage
counts each prompt once and the tokens of every returned sequence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from engine.outputs import Logprob
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest
from serving.http.generation import Generation, RequestRefused
from serving.http.protocol import SamplingFields
from serving.http.state import ServerState
from serving.http.streaming import cancel_on_disconnect

# Fields a beam search request may set besides its prompt or messages
# (``spaces_between_special_tokens``: taken, changing nothing, as in vLLM),
# those that change no answer here among them (``SamplingFields``' first).
_BEAM_FIELDS = frozenset({
    "session_id", "kv_transfer_params", "ec_transfer_params", "vllm_xargs",
    "return_token_offsets", "return_mm_kwargs", "routed_experts_prompt_start",
    "stream_interval",
    "model", "n", "max_tokens", "max_completion_tokens", "temperature", "ignore_eos",
    "length_penalty", "include_stop_str_in_output", "use_beam_search", "priority",
    "skip_special_tokens", "spaces_between_special_tokens", "add_special_tokens", "user",
    "stream", "add_generation_prompt", "continue_final_message", "chat_template_kwargs",
    "chat_template",
    "include_reasoning", "documents", "reasoning_effort", "request_id", "return_token_ids",
    "cache_salt",
})


def check_beam_fields(request: SamplingFields, prompt_field: str,
                      also: tuple[str, ...] = ()) -> None:
    """``InvalidRequestError`` naming the fields set beside ``use_beam_search``
    (``SamplingFields.asks_for``) that it does not take (``stream`` only
    as false); ``also``: the route's own fields it takes (a chat's
    ``echo``: text before each sequence's)."""
    extra = sorted(f for f in request.model_fields_set - _BEAM_FIELDS - {prompt_field, *also}
                   if request.asks_for(f))
    if request.stream:
        extra.insert(0, "stream")
    if extra:
        raise InvalidRequestError(f"use_beam_search does not take {', '.join(extra)}")


def beam_params(request: SamplingFields, max_tokens: int) -> BeamSearchParams:
    """The request's ``BeamSearchParams`` (``InvalidRequestError`` for a bad
    value)."""
    params = BeamSearchParams(
        beam_width=request.n, max_tokens=max_tokens, ignore_eos=request.ignore_eos,
        temperature=0.0 if request.temperature is None else request.temperature,
        length_penalty=request.length_penalty,
        include_stop_str_in_output=request.include_stop_str_in_output)
    params.check(max_logprobs=-1)  # the engine checks 2 * n against its own limit
    return params


async def beam_search(state: ServerState, prompts: list[list[int]], params: BeamSearchParams,
                      priority: int, cache_salt: str | None = None, enable_thinking: bool = True,
                      lora_request: LoRARequest | None = None
                      ) -> tuple[list[BeamSearchOutput], list[bool]]:
    """Each prompt's best sequences, their tokens without the prompt's, and
    whether its outputs begin inside their reasoning (the engine's word on
    the first step's requests, the prompts themselves); every step's
    requests carry the request's ``cache_salt``, ``enable_thinking`` and
    LoRA adapter.
    ``RequestRefused`` where the engine refuses a step's requests (naming
    beam search's logprobs, and blaming ``n``, which asked for them, where
    those are what it refused)."""
    search = BeamSearch(prompts, params, state.eos_token_ids, state.max_model_len,
                        keep_eos=params.include_stop_str_in_output)
    step = search.step_params.to_dict()
    in_reasoning: list[bool] | None = None
    queue = asyncio.Queue()  # every step's: one replica of a data-parallel link for them all
    while requests := search.requests():
        generation = Generation(state.link, metrics=None, queue=queue)
        try:
            await generation.start(requests, [step], [], priority, cache_salt=cache_salt,
                                   enable_thinking=enable_thinking, lora_request=lora_request)
        except RequestRefused as e:
            if "logprobs" not in str(e):
                raise
            raise RequestRefused(f"use_beam_search with n {params.beam_width} asks "
                                 f"{2 * params.beam_width} logprobs a token: {e}", e.code,
                                 "n") from None
        if in_reasoning is None:  # the first step: one request a prompt
            in_reasoning = [generation.starts_in_reasoning(i) for i in range(len(requests))]
        candidates: list[dict[int, Logprob]] = [{} for _ in requests]
        try:
            async for event in generation.events():
                if event.logprobs:
                    candidates[event.index] = {c.token_id: Logprob(c.logprob, c.rank)
                                               for c in event.logprobs[0]}
        except BaseException:
            generation.abort_unfinished()
            raise
        search.advance(candidates)
    outputs = search.outputs()
    for prompt, output in zip(prompts, outputs):
        for sequence in output.sequences:
            del sequence.tokens[:len(prompt)]
    return outputs, in_reasoning or [False] * len(prompts)


async def respond_with_beams(state: ServerState, raw: Request, request: SamplingFields,
                             prompts: list[list[int]], max_tokens: int, head: dict,
                             choice: Callable[[int, str, list[int], bool], dict],
                             enable_thinking: bool = True) -> Response:
    """The whole answer: for prompt p, choices p * n .. p * n + n - 1 (best
    first), each ``choice(p, text, token_ids, in_reasoning)`` (the route's
    fields for a sequence of prompt p: its text, its token ids where the
    request returns them, and whether it begins inside its reasoning, the
    engine's word) with its finish and stop reasons; a client that leaves
    stops the search."""
    params = beam_params(request, max_tokens)

    async def body() -> dict:
        outputs, in_reasoning = await beam_search(state, prompts, params, request.priority,
                                                  request.cache_salt, enable_thinking,
                                                  state.lora_request(request.model))
        choices, generated = [], 0
        for p, output in enumerate(outputs):
            for i, sequence in enumerate(output.sequences):
                text = state.tokenizer.decode(sequence.tokens, request.skip_special_tokens)
                choices.append({"index": p * request.n + i,
                                **choice(p, text, sequence.tokens, in_reasoning[p]),
                                "finish_reason": sequence.finish_reason,
                                "stop_reason": sequence.stop_reason})
                generated += len(sequence.tokens)
        prompt_tokens = sum(map(len, prompts))
        return {**head, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                          "total_tokens": prompt_tokens + generated}}

    return JSONResponse(await cancel_on_disconnect(raw, body()))
