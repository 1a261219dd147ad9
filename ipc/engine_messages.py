"""Messages between engine clients and ``tprun serve``, as msgspec Structs.

The server binds a ROUTER socket; each client connects a DEALER, so every
answer goes to the client that asked. Client -> server: ``GenerateRequest``,
``AbortRequest``, ``StatsRequest``, ``EngineControl``. Server -> client:
``RequestAccepted``, ``Outputs`` (the new tokens of that client's requests
in one engine step), ``RequestError``, ``EngineStats``, ``ControlDone``,
and ``EngineStopped`` to every client
with live requests when the engine stops (shut down, or a worker died).

Request ids are the client's own; they need only be unique among that
client's live requests. All unions are tagged; nothing is ever pickled.
On the socket each message is sealed with the launch's secret
(``ipc.auth``: frames ``[mac, payload]``); these are the payloads.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ipc.lora_request import LoRARequest


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Generate for one prompt: give exactly one of ``prompt`` (text) and
    ``prompt_token_ids``. ``sampling_params`` holds ``SamplingParams``
    fields by name; missing ones take their defaults. ``priority``: lower
    first under the engine's "priority" scheduling policy (another than 0
    is refused under "fcfs"). ``enable_thinking`` (vLLM's
    ``chat_template_kwargs`` switch, as ``engine.reasoning.enable_thinking_of``
    reads it): false, under a reasoning parser that reads the switch
    (``qwen3``), the output has no reasoning; the engine decides from it and
    the prompt where the output begins (``RequestAccepted``).
    ``cache_salt`` (vLLM's): the prompt's, keying its prefix-cache blocks
    apart from other salts'. ``pooling_params`` (an embedding engine's
    requests): ``PoolingParams`` fields by name; given, the request is an
    embedding, whose one delta carries it (``Delta.embedding``), and
    ``sampling_params`` is ignored. ``lora_request``: the LoRA adapter it
    runs with (None: the base model)."""

    request_id: str
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    sampling_params: dict[str, Any] = {}
    priority: int = 0
    enable_thinking: bool = True
    cache_salt: str | None = None
    pooling_params: dict[str, Any] | None = None
    lora_request: LoRARequest | None = None


class AbortRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Stop a request; it is answered with a last ``Delta`` whose
    ``finish_reason`` is "abort". Unknown or finished ids are ignored."""

    request_id: str


class StatsRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask for an ``EngineStats`` snapshot (also a health check)."""


# The engine calls an ``EngineControl`` may name: sleep mode and the prefix
# cache, and the workers' torch profiler.
ENGINE_CONTROLS = ("sleep", "wake_up", "is_sleeping", "reset_prefix_cache",
                   "start_profile", "stop_profile")


class EngineControl(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Call ``method`` (one of ``ENGINE_CONTROLS``) on the engine itself, as
    ``LLM`` names it: ``sleep`` takes ``level``, ``wake_up`` ``tags`` (None:
    all), ``start_profile`` ``profile_prefix`` (the trace names' start);
    the other fields are ignored. Answered with one ``ControlDone`` once the
    engine has done it (``stop_profile``: once every worker has written its
    trace); a client's controls are answered in the order it sent them."""

    method: str
    level: int = 1
    tags: list[str] | None = None
    profile_prefix: str | None = None


class ControlDone(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The answer to an ``EngineControl``: ``value`` is whether the engine
    sleeps after it (``sleep``, ``wake_up``, ``is_sleeping``) or whether the
    prefix cache was reset (``reset_prefix_cache``), False for the
    profiler's; ``error`` why the engine did not do it (sleep mode off, an
    unknown tag; no ``profiler_config``, vLLM's message, or a profiler
    call that failed on a worker that still serves), None once done."""

    method: str
    value: bool = False
    error: str | None = None


class RequestAccepted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The request passed validation and is queued; its prompt's ids, and
    whether under the engine's reasoning parser its output begins inside
    its reasoning (``starts_in_reasoning``, the engine's one decision of
    it: ``engine.reasoning.Reasoning.starts_inside``; False without a
    parser), by which a caller reads the output's text."""

    request_id: str
    prompt_token_ids: list[int]
    starts_in_reasoning: bool = False


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One candidate token's log-probability and rank (1 = most likely)."""

    token_id: int
    logprob: float
    rank: int | None = None


class Delta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """New tokens of one request, and the text they complete. ``finish_reason``
    ("stop", "length", "abort", "error", "repetition") is set exactly when ``finished`` is.
    ``logprobs``, for a request that asked for them, has one list per new
    token: the top-N candidates in rank order, then the sampled token when
    it is not among them. ``prompt_logprobs`` (once, for a request that asked)
    has one entry per prompt token, None for the first, each the top-k
    candidates then the prompt token when it is not among them.
    ``num_cached_tokens``: the prompt tokens found in the prefix cache.
    ``stop_reason``: on the last delta, the stop token id that ended the
    request (one of its ``stop_token_ids``, or of the model's end ids other
    than the tokenizer's, which vLLM adds to them; vLLM's field), or
    "repetition_detected" for finish reason "repetition".
    ``embedding``: an embedding request's, on its one delta: float32
    little-endian bytes.

    Encoded without the fields at their defaults (``omit_defaults``): a
    decode step's delta is mostly defaults, and every delta of every step
    crosses the engine's socket, so a step's ``Outputs`` are about half the
    bytes and decode faster.
    """

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[list[TokenLogprob]] | None = None
    prompt_logprobs: list[list[TokenLogprob] | None] | None = None
    num_cached_tokens: int | None = None
    embedding: bytes | None = None


class Outputs(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """One engine step's deltas for one client's requests (or a run of them,
    where their pooled outputs would pass ``ipc.serde.MAX_POOLED_BYTES``)."""

    deltas: list[Delta]


class RequestError(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A request was refused (nothing of it was scheduled). ``request_id``
    is None when the message was too malformed to name one.
    ``invalid_request``: refused for what it asks (an
    ``ipc.errors.InvalidRequestError``: a value out of range, a prompt too
    long, a constraint that does not compile), which a front end passes on
    to its own client as that client's error (HTTP 400); False: the engine
    could not take it for another reason, a message the protocol does not
    allow (an id in use, n > 1) or the engine's own failure (logged
    there), which is no end user's doing (HTTP 500). ``code`` and
    ``param``: the refusal's ``InvalidRequestError.code`` and ``.param``
    (OpenAI's error code and the request field at fault, where it names
    them), so a front end answers with the same ones; None for any other
    refusal."""

    request_id: str | None
    error: str
    code: str | None = None  # OpenAI's error code where one applies ("context_length_exceeded")
    invalid_request: bool = False
    param: str | None = None  # the request field at fault ("max_tokens"), where one is named


class EngineStopped(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The engine stopped; none of this client's live requests will finish.
    ``failed``: it stopped for a fault (a worker died, a step failed), not
    because it was told to shut down."""

    reason: str
    failed: bool = True


class EngineStats(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A snapshot of the engine: its queues, its KV blocks, its counters
    since start (tokens, steps, preemptions, prefix-cache lookups).
    ``num_waiting``: requests not scheduled yet, from their arrival: the
    scheduler's queue and those a server is still admitting (a grammar
    compiling, a text being tokenized; ``LLMEngine.get_stats``).
    ``num_refused_messages``: client messages the server dropped unread
    for want of a valid MAC (0 from an engine that has no server).
    ``spec_decode_*``: speculative decoding counters since start (vLLM's
    names): rows that verified drafts, drafts verified, drafts accepted,
    accepted drafts by position (empty when speculative decoding is off).
    ``prefix_cache_queries`` / ``prefix_cache_hits``: prompt tokens looked
    up in the prefix cache since start, and of those found (``prefix_hit_rate``
    is their ratio). ``running_lora_adapters`` / ``waiting_lora_adapters``
    (vLLM's names): each LoRA adapter's name and how many of the running
    (waiting, as ``num_waiting`` counts them) requests run with it, in the
    order of the requests there; an adapter with none is not listed (both
    empty without LoRA)."""

    num_running: int
    num_waiting: int
    num_blocks: int
    num_free_blocks: int
    kv_usage: float
    prefix_hit_rate: float
    num_preemptions: int
    num_steps: int
    num_prompt_tokens: int
    num_generation_tokens: int
    num_scheduled_tokens: int
    num_refused_messages: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = []
    running_lora_adapters: dict[str, int] = {}
    waiting_lora_adapters: dict[str, int] = {}


ClientMessage = GenerateRequest | AbortRequest | StatsRequest | EngineControl
ServerMessage = (RequestAccepted | Outputs | RequestError | EngineStats | EngineStopped
                 | ControlDone)

_client_decoder = msgspec.msgpack.Decoder(ClientMessage)
_server_decoder = msgspec.msgpack.Decoder(ServerMessage)


def decode_client_message(data: bytes) -> ClientMessage:
    """Raises ``ValueError`` naming what is wrong with malformed bytes,
    values nested deeper than the decoder can go (its ``RecursionError``)
    included: no message can end the loop that reads them."""
    try:
        return _client_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"malformed request: {e}") from None
    except RecursionError:
        raise ValueError("malformed request: values nested too deep to decode") from None


def decode_server_message(data: bytes) -> ServerMessage:
    try:
        return _server_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"malformed reply from the engine: {e}") from None


def request_id_of(data: bytes) -> str | None:
    """The ``request_id`` field of a message that failed to decode, if its
    bytes are a msgpack map holding a string there."""
    try:
        raw = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    value = raw.get("request_id") if isinstance(raw, dict) else None
    return value if isinstance(value, str) else None
