"""Every message that crosses a socket, as msgspec Structs.

Broadcast (executor -> every worker): ``SchedulerOutput`` for a step, the
step's ``GrammarBitmask`` after it when the step has constrained requests,
or a ``ControlCall``. Replies (worker -> executor): ``ModelRunnerOutput`` from the
output rank only, ``ControlReply`` from every rank, ``WorkerError`` from any
rank whose step failed. Engine endpoint (client <-> engine): ``ClientRequest``
and friends live in ``ipc.engine_messages``.

All unions are tagged (``tag=True``) so a decoder knows the type from the
bytes alone; nothing here is ever pickled.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from ipc.config import ControlArg

MAX_TOKEN_LIST = 1024  # entries of a request's logit_bias, allowed_token_ids, bad-word sequences
MAX_BAD_WORD_TOKENS = 32  # ids of one bad-word sequence
MAX_LOGPROB_TOKEN_IDS = 128  # ids of a request's logprob_token_ids (vLLM's limit)
# ``logprobs`` / ``prompt_logprobs`` value asking for every vocabulary token (vLLM's -1).
WHOLE_VOCAB = -1


class SamplingOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The sampling fields the runner needs: their one definition, with
    their defaults and their ranges (``problems``).

    ``temperature == 0`` means greedy. ``top_k == 0`` and ``top_p == 1`` and
    ``min_p == 0`` disable those filters. ``seed`` makes the request's draws
    depend only on (seed, position). ``logprobs`` asks for that many top
    logprobs per sampled token (None: none; ``WHOLE_VOCAB``, -1: every
    token of the vocabulary, as ``prompt_logprobs``). Until ``min_tokens`` tokens are
    generated, the request's stop and end-of-sequence ids cannot be sampled
    (the ids come in ``NewRequestData.min_tokens_stop_ids``).
    ``prompt_logprobs`` asks for each prompt token's logprob plus that many
    top ones (None: none). ``logit_bias`` adds each value to its token's
    logit, and ``allowed_token_ids`` leaves only those tokens to draw
    (vLLM's; both before the penalties, at most MAX_TOKEN_LIST entries, ids
    inside the vocabulary, which the engine checks). ``bad_words_token_ids``
    are token sequences the request must not complete: where its last
    output tokens are a sequence but its last id, that id cannot be drawn
    (vLLM's ``bad_words``, which the engine tokenizes into these; at most
    MAX_TOKEN_LIST sequences of 1 to MAX_BAD_WORD_TOKENS ids inside the
    vocabulary). ``logprob_token_ids`` (vLLM's; 1 to MAX_LOGPROB_TOKEN_IDS
    ids inside the vocabulary) are the tokens whose logprobs each sampled
    token reports in place of its top ones, in the list's order, where the
    request asked for ``len(logprob_token_ids)`` of them (``logprobs`` None
    or that count). ``extra_args`` (vLLM's) are arguments for custom logits
    processors (``runner.sampling.logits_processor``), which read them in
    ``BatchUpdate.added``: None or a JSON object (``is_json_object``: it
    crosses the socket as plain data). ``engine.SamplingParams``
    extends this Struct with the fields only the engine reads, so a field
    the runner needs is added here, once, and reaches the API, the HTTP
    server and the wire (``SamplingParams.to_options``) from here.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    min_tokens: int = 0
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    logprob_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None

    def problems(self) -> list[str]:
        """Each field outside its range, as a message (empty: none). The
        engine refuses a request with any (``SamplingParams``); the runner's
        ``plan_check`` refuses a plan with any. Only the messages of
        failing checks are formatted (every plan checks every new request)."""
        return [message.format(self) for ok, message in _SAMPLING_RANGES if not ok(self)]


# How deep ``extra_args`` may nest (lists and objects inside it).
MAX_EXTRA_ARGS_DEPTH = 32
_INT64 = (-(1 << 63), (1 << 63) - 1)

# (check, message) of each SamplingOptions field's range; ``{0}`` is the options.
_SAMPLING_RANGES = (
    (lambda o: o.temperature >= 0, "temperature must be >= 0 (0 = greedy), got {0.temperature}"),
    (lambda o: 0 < o.top_p <= 1, "top_p must be in (0, 1], got {0.top_p}"),
    (lambda o: o.top_k >= 0, "top_k must be >= 0 (0 or -1 = disabled), got {0.top_k}"),
    (lambda o: 0 <= o.min_p <= 1, "min_p must be in [0, 1], got {0.min_p}"),
    (lambda o: o.repetition_penalty > 0,
     "repetition_penalty must be > 0 (1 = off), got {0.repetition_penalty}"),
    (lambda o: -2 <= o.presence_penalty <= 2,
     "presence_penalty must be in [-2, 2] (0 = off), got {0.presence_penalty}"),
    (lambda o: -2 <= o.frequency_penalty <= 2,
     "frequency_penalty must be in [-2, 2] (0 = off), got {0.frequency_penalty}"),
    (lambda o: o.logprobs is None or o.logprobs >= WHOLE_VOCAB,
     "logprobs must be None, an int >= 0 or -1 (the whole vocabulary), got {0.logprobs}"),
    (lambda o: o.min_tokens >= 0, "min_tokens must be >= 0, got {0.min_tokens}"),
    (lambda o: o.prompt_logprobs is None or o.prompt_logprobs >= WHOLE_VOCAB,
     "prompt_logprobs must be None, an int >= 0 or -1 (the whole vocabulary), "
     "got {0.prompt_logprobs}"),
    (lambda o: not o.logit_bias or (len(o.logit_bias) <= MAX_TOKEN_LIST
                                    and all(t >= 0 for t in o.logit_bias)
                                    and all(math.isfinite(b) for b in o.logit_bias.values())),
     "logit_bias must map at most " + str(MAX_TOKEN_LIST) + " token ids >= 0 to finite "
     "numbers"),
    (lambda o: o.allowed_token_ids is None or (0 < len(o.allowed_token_ids) <= MAX_TOKEN_LIST
                                               and all(t >= 0 for t in o.allowed_token_ids)),
     "allowed_token_ids must be None or 1 to " + str(MAX_TOKEN_LIST) + " token ids >= 0"),
    (lambda o: o.bad_words_token_ids is None or (
        len(o.bad_words_token_ids) <= MAX_TOKEN_LIST
        and all(0 < len(s) <= MAX_BAD_WORD_TOKENS and all(t >= 0 for t in s)
                for s in o.bad_words_token_ids)),
     "bad_words_token_ids must be None or at most " + str(MAX_TOKEN_LIST) + " sequences of 1 "
     "to " + str(MAX_BAD_WORD_TOKENS) + " token ids >= 0 (a bad word gives one or two)"),
    (lambda o: o.logprob_token_ids is None or (
        0 < len(o.logprob_token_ids) <= MAX_LOGPROB_TOKEN_IDS
        and all(t >= 0 for t in o.logprob_token_ids)
        and o.logprobs in (None, len(o.logprob_token_ids))),
     "logprob_token_ids must be None or 1 to " + str(MAX_LOGPROB_TOKEN_IDS) + " token ids "
     ">= 0, with logprobs None or their number"),
    (lambda o: o.extra_args is None or is_json_object(o.extra_args),
     "extra_args must be None or a JSON object: str keys, values null, bool, 64-bit int, "
     "finite float, str, list or object, nested at most " + str(MAX_EXTRA_ARGS_DEPTH) + " deep"),
)


def is_json_object(value: Any) -> bool:
    """Whether ``value`` is a dict that JSON can hold as it is: str keys,
    values None, bool, int within 64 bits, finite float, str, list or such
    a dict, nested at most ``MAX_EXTRA_ARGS_DEPTH`` deep."""
    return isinstance(value, dict) and _is_json(value, MAX_EXTRA_ARGS_DEPTH)


def _is_json(value: Any, depth: int) -> bool:
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        return _INT64[0] <= value <= _INT64[1]
    if isinstance(value, float):
        return math.isfinite(value)
    if depth == 0:
        return False
    if isinstance(value, list):
        return all(_is_json(v, depth - 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v, depth - 1) for k, v in value.items())
    return False


class LoRALoad(msgspec.Struct, frozen=True, kw_only=True):
    """Load the adapter in ``lora_path`` (PEFT's format, checked by the
    engine: ``ipc.lora_adapter.read_adapter``) into adapter slot ``slot``,
    in place of the one there. Every rank reads the file itself and keeps
    its shard."""

    slot: int
    lora_int_id: int
    lora_path: str


class NewRequestData(msgspec.Struct, frozen=True, kw_only=True):
    """A request that is new to the runner (or resumed after preemption).

    ``prefill_token_ids`` holds every token the runner must feed before it
    samples: the prompt, plus the tokens already generated when a preempted
    request comes back. ``block_ids[g]`` are its KV blocks in cache group g.
    ``num_computed_tokens`` are already in the KV cache (prefix cache hits).
    ``min_tokens_stop_ids``: the ids ``sampling.min_tokens`` holds back (the
    request's stop ids and its end-of-sequence ids, ``ignore_eos`` or not).
    ``lora_slot``: the adapter slot it runs with (-1: none).
    ``pooling_task``: a pooling request's task (vLLM's ``PoolingParams.task``;
    None: a generating request); one of ``TOKEN_POOLING_TASKS`` gets one
    output row per prompt token, every chunk its own rows.
    """

    req_id: str
    prompt_token_ids: list[int]
    prefill_token_ids: list[int]
    sampling: SamplingOptions
    block_ids: list[list[int]]
    num_computed_tokens: int
    max_tokens: int
    min_tokens_stop_ids: list[int] = []
    lora_slot: int = -1
    pooling_task: str | None = None


class CachedRequestData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Requests the runner already holds, in parallel lists.

    ``new_block_ids[i][g]`` are blocks appended to request i's table in
    group g; ``None`` when request i gets no new block (most decode steps:
    a None decodes far faster than nested empty lists). Nothing the runner
    holds is repeated: it counts each request's computed tokens itself (a
    request whose count the scheduler resets, after preemption, comes back
    as a ``NewRequestData`` with its ``num_computed_tokens``). The one
    exception, with speculative decoding only: ``num_computed_tokens[i]``,
    the scheduler's count before this step, which counts every draft of a
    step whose output it has not seen as accepted: an upper bound of the
    runner's device count (by at most the drafts of one step), which the
    runner keeps as its host count so that host checks stay bounded (None
    without speculative decoding).
    """

    req_ids: list[str] = []
    new_block_ids: list[list[list[int]] | None] = []
    num_computed_tokens: list[int] | None = None


class SchedulerOutput(msgspec.Struct, frozen=True, kw_only=True, tag=True, omit_defaults=True):
    """The plan of one step, broadcast to every rank; it names each
    scheduled request once. ``num_scheduled_tokens[i]`` is the token count
    of the i-th of ``scheduled_req_ids()``: the cached requests, then the
    new ones, in their lists' order (the order of the reply's rows)."""

    step_id: int
    scheduled_new_reqs: list[NewRequestData] = []
    scheduled_cached_reqs: CachedRequestData = CachedRequestData()
    num_scheduled_tokens: list[int] = []
    finished_req_ids: list[str] = []
    preempted_req_ids: list[str] = []
    # Requests of this step that sample under a grammar (structured outputs)
    # or may have their token forced (a thinking budget): when not empty, the
    # workers run the forward pass and wait for the step's GrammarBitmask
    # before they sample.
    structured_output_req_ids: list[str] = []
    # Adapters to load before the step's requests are added (LoRA serving):
    # an adapter slot is reloaded only when no running request uses it.
    lora_loads: list[LoRALoad] = []

    def scheduled_req_ids(self) -> list[str]:
        return self.scheduled_cached_reqs.req_ids + [n.req_id for n in self.scheduled_new_reqs]

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    def is_empty(self) -> bool:
        """Nothing for a worker to run or to forget: no request scheduled,
        finished or preempted (the engine settles such a plan itself)."""
        return not (self.scheduled_new_reqs or self.scheduled_cached_reqs.req_ids
                    or self.finished_req_ids or self.preempted_req_ids)


class GrammarBitmask(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The allowed tokens of one step's constrained requests, sent after the
    step's plan (so the engine computes it while the forward pass runs);
    with async scheduling after the next step's plan too, which the workers
    keep until this step has sampled (``worker.step_order``).

    ``bitmask`` is int32, little-endian, row-major ``[rows,
    ceil(vocab_size / 32)]``; bit j of word w set means token ``32 * w + j``
    is allowed. ``req_ids`` are exactly the plan's
    ``structured_output_req_ids``, in any order; a worker rejects any other
    set or size. ``num_rows``: empty (one row each), or the rows of each of
    ``req_ids`` in turn, between 1 and its logits rows in the step: a
    request's n rows mask its last n logits rows in order. A request with a
    grammar and d drafts in the step has 1 + d: row i is the grammar's mask
    after its tokens before the step and its drafts 1..i (the rows after a
    draft the grammar refuses allow every token: that draft, masked out of
    the row before it, is rejected there, so they are never used).

    ``draft_req_ids``: the requests with a grammar, whose drafts for their
    next step the step's reply carries
    (``ModelRunnerOutput.next_draft_token_ids``), so that the next step's
    bitmask can be filled over them.

    ``forced_token_ids``: empty, or one per row: the token that row's
    request must sample (its thinking budget forces the end of its
    reasoning; its row allows every token), -1 for a row that is not
    forced. A forced token is sampled whatever the request's own
    ``allowed_token_ids``, ``bad_words``, ``logit_bias`` or ``min_tokens``
    say, as vLLM's budget, applied after them, sets it, and its logprob is
    the model's own, read before the sampler forces it.

    ``thinking_states``: empty, or one per row: ``[]`` for a row whose
    request has no thinking budget or no drafts in the step, else its
    budget's state after every token before the step's (``[open, spent,
    budget, start_id, end_id]``, ``open`` 0 or 1), from which the workers
    find its forced rows, folded over its drafts on the device
    (``runner.spec_decode.drafted_budgets``).

    Contract between the two (the engine keeps it; a worker rejects a
    message that breaks it as an invalid plan): a budgeted request with
    drafts in the step has its state and forced id -1; one without drafts
    has ``[]`` and its forced id (or -1). A row never carries both.
    """

    step_id: int
    req_ids: list[str]
    bitmask: bytes
    forced_token_ids: list[int] = []
    thinking_states: list[list[int]] = []
    num_rows: list[int] = []
    draft_req_ids: list[str] = []


class Logprobs(msgspec.Struct, frozen=True, kw_only=True):
    """Per sampled token: the top-N token ids and logprobs, the sampled
    token's own logprob and its rank (1 = most likely)."""

    top_token_ids: list[list[int]]
    top_logprobs: list[list[float]]
    sampled_logprobs: list[float]
    sampled_ranks: list[int]


class PromptLogprobs(msgspec.Struct, frozen=True, kw_only=True):
    """Prompt logprobs scored in one step: request ``req_ids[j]`` scored
    ``counts[j]`` prompt tokens from prompt index ``starts[j]`` (>= 1) on;
    ``logprobs`` has one row per scored token, requests in that order (the
    "sampled" entries are the prompt token's own logprob and rank)."""

    req_ids: list[str]
    starts: list[int]
    counts: list[int]
    logprobs: Logprobs


class ModelRunnerOutput(msgspec.Struct, frozen=True, kw_only=True, tag=True, omit_defaults=True):
    """The output rank's reply to one step, in the plan's order: row i answers
    the i-th request of the step's ``scheduled_req_ids()``.

    Flat, because a decode step's reply is on every step's path: row i's
    tokens are the next ``num_sampled[i]`` entries of ``sampled_token_ids``;
    ``num_sampled`` None means one token per row (the usual decode step). A
    row samples nothing when its prefill chunk stops short of its prompt.
    ``logprobs`` has one row per sampled token, in the same order.
    ``prompt_logprobs``: the prompt tokens scored in this step, if any.
    ``next_draft_token_ids``: for each of the step's bitmask's
    ``draft_req_ids``, the k drafts the runner proposed after this step
    (those its next step verifies the first of); empty otherwise.
    ``pooled`` (a pooling runner only; its rows sample nothing): for each
    request whose prompt's last token ran in this step, its pooled hidden
    state, float32 little-endian bytes of ``pooled_size`` values (the
    model's hidden size; a classifier's logits), before any truncation,
    normalization or activation (the engine applies the request's); for a
    token-level request (``NewRequestData.pooling_task``), on every step
    that runs a chunk of its prompt, that chunk's rows, one per token, one
    after the other.

    This reply, the plan (``SchedulerOutput``) and its ``CachedRequestData``
    are encoded without the fields at their defaults (``omit_defaults``):
    they cross a socket every step, and most of their optional fields are
    empty on most steps.
    """

    step_id: int
    sampled_token_ids: list[int]
    num_sampled: list[int] | None = None
    logprobs: Logprobs | None = None
    prompt_logprobs: PromptLogprobs | None = None
    next_draft_token_ids: dict[str, list[int]] = {}
    pooled: dict[str, bytes] = {}

    def rows(self) -> list[list[int]]:
        """Each row's tokens, in plan order."""
        tokens = self.sampled_token_ids
        if self.num_sampled is None:
            return [[t] for t in tokens]
        rows, start = [], 0
        for n in self.num_sampled:
            rows.append(tokens[start: start + n])
            start += n
        if start != len(tokens):
            raise ValueError(f"num_sampled adds up to {start}, not {len(tokens)} tokens")
        return rows


class ControlCall(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An RPC that every rank executes and answers (load, profile, ...).

    ``kwargs`` values are typed (``ControlArg``): ``load_model``'s
    ``RunnerConfig`` arrives as a ``RunnerConfig``, not as a dict."""

    call_id: int
    method: str
    kwargs: dict[str, ControlArg] = {}


class ControlReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """One rank's answer to a ``ControlCall``; ``error`` set on failure."""

    call_id: int
    rank: int
    result: Any = None
    error: str | None = None


class WorkerError(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A rank failed a step: which rank, which step, the traceback text.

    ``fatal=False`` means the plan was rejected before anything changed
    (every rank rejects it alike) and the worker keeps serving; otherwise
    the rank's state is unknown and the executor must stop.
    """

    rank: int
    step_id: int
    error: str
    fatal: bool = True


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Sent by every rank twice a second: the last step it started and the
    last it finished queueing, so a stuck step can name the stuck ranks."""

    rank: int
    step_started: int
    step_finished: int


class Hello(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Start-up handshake: a worker announces itself, then acknowledges
    each ``Sync`` it receives on the broadcast channel."""

    rank: int
    pid: int
    sync_id: int = -1


class Sync(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Published by the executor until every rank has answered with a
    ``Hello`` carrying this ``sync_id``: then no broadcast can be lost to
    a subscriber that joined late."""

    sync_id: int


Broadcast = SchedulerOutput | GrammarBitmask | ControlCall | Sync
Reply = ModelRunnerOutput | ControlReply | WorkerError | Hello | Heartbeat
