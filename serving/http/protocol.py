"""Request and response bodies of the OpenAI API (the fields tprun serves).

Requests are pydantic models: a field of the wrong type is answered with
HTTP 400 naming it; unknown fields are ignored, as OpenAI's clients send
fields this server has no use for. The extra fields that vLLM accepts
(``top_k``, ``min_p``, ``repetition_penalty``, ``stop_token_ids``,
``ignore_eos``, ``min_tokens``, ``prompt_logprobs``, ``bad_words``,
``thinking_token_budget``, ``skip_special_tokens``, ``spaces_between_special_tokens``,
``priority``, ``return_tokens_as_token_ids``, ``return_token_ids``, ``cache_salt``,
``truncation_side``, ``request_id``, ``add_special_tokens``, the chat's
``documents``, ``reasoning_effort`` and ``return_prompt_text``,
``stream_options.continuous_usage_stats``, ``structured_outputs`` and the
``guided_*`` fields) have vLLM's names; those of its fields this server does
not implement are refused where they ask for something, and those that
change no answer here are taken (``SamplingFields``). Responses are plain dicts built by the
serving code; ``error_body`` is the one error shape every route uses.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.sampling_params import SamplingParams
from ipc.errors import InvalidRequestError

# Prompt token ids travel to the engine as signed 64-bit values: a larger one
# is a bad request (400 naming the field), not a failure to encode it. The
# sampling fields' ints are bounded by SamplingParams, which checks them first.
Int64 = Annotated[int, Field(ge=-(1 << 63), le=(1 << 63) - 1)]
# vLLM's reasoning efforts (the chat's ``reasoning_effort``, the Responses
# API's ``reasoning.effort``): what the chat template gets as ``reasoning_effort``.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
_DECIMAL_INT = re.compile(r"-?[0-9]+")  # a token id as logit_bias keys spell it
# What a sampling field's default is in SamplingParams (frequency_penalty 0,
# top_p 1, ...): sent so, a field asks for nothing (``SamplingFields.asks_for``).
_NEUTRAL = {f.name: f.default for f in msgspec.structs.fields(SamplingParams)
            if f.default is not msgspec.NODEFAULT}


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(BaseModel):
    """Fields both completion routes share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    min_tokens: int = 0
    prompt_logprobs: int | None = Field(default=None, ge=-1)  # -1: the whole vocabulary

    logit_bias: dict[str, float] | None = None  # token id (as text) -> bias
    allowed_token_ids: list[Int64] | None = None
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Int64 | None = None
    # vLLM's: the side truncate_prompt_tokens cuts off ("right" keeps the first k).
    truncation_side: Literal["left", "right"] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    bad_words: list[str] | None = None
    # vLLM's: under ``--scheduling-policy priority`` lower values are served
    # first; any other value than 0 is refused under "fcfs" (by the engine).
    priority: Int64 = 0
    # vLLM's: each token in logprobs shown as "token_id:N" instead of its text.
    return_tokens_as_token_ids: bool = False
    # vLLM's: the answer's id after its prefix (serving/http/response_ids.py).
    request_id: str | None = None
    # vLLM's: the answer also carries its prompt's and its choices' token ids
    # (serving/http/token_ids.py).
    return_token_ids: bool = False
    # vLLM's: mixed into the hash of the prompt's first KV block, so only
    # requests of the same salt share prefix-cache blocks (a non-empty string).
    cache_salt: str | None = None

    # Structured outputs (serving/http/structured.py): OpenAI's
    # response_format, vLLM's structured_outputs and its older guided_* fields.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    # vLLM's beam search (serving/http/beam_search.py): ``n`` is the beam width.
    use_beam_search: bool = False
    length_penalty: float = 1.0

    # vLLM's, taken and changing no answer here, as in a vLLM server without
    # what uses them: routing and disaggregation hints, fields of its render
    # routes and of mixture-of-experts routing data.
    session_id: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    # vLLM's: the request's ``SamplingParams.extra_args``, which custom logits
    # processors read (``--logits-processors``).
    vllm_xargs: dict[str, Any] | None = None
    return_token_offsets: bool | None = None
    return_mm_kwargs: bool = True
    routed_experts_prompt_start: int = Field(default=0, ge=0)
    # vLLM's: at most this many reasoning tokens, then the end of the
    # thinking forced (engine/thinking_budget.py); -1 or null: no limit.
    thinking_token_budget: Int64 | None = None
    # vLLM's: how many new tokens a stream's chunk groups, the first token
    # alone and the last chunk taking the rest (``stream_interval.py``).
    stream_interval: int | None = Field(default=None, ge=1)
    user: str | None = None

    # Fields OpenAI or vLLM define that change the answer but this server
    # does not implement: a request that sets one (to a value that asks for
    # something, ``asks_for``) is refused rather than answered as if it had
    # not. ``ASKS_NOTHING``: values of theirs that vLLM reads as unset.
    logits_processors: list[Any] | None = None
    watermarking: bool | None = None
    UNSUPPORTED: ClassVar[tuple[str, ...]] = ("logits_processors", "watermarking")
    ASKS_NOTHING: ClassVar[dict[str, tuple]] = {
        "thinking_token_budget": (-1,), "watermarking": (False,), "logprob_token_ids": ([],)}
    # vLLM's: end an output that repeats one N-gram (``engine.repetition``).
    repetition_detection: dict[str, Any] | None = None
    # vLLM's: each token's logprobs are those of these ids (with the route's
    # logprobs on; ``engine.SamplingParams``); [] asks for nothing, as in vLLM.
    logprob_token_ids: list[Int64] | None = None

    def listed_logprobs(self, logprobs_on: bool, needs: str) -> list[int] | None:
        """The request's ``logprob_token_ids`` (None: none, or empty); a
        ``FieldError`` naming the field where the route's logprobs are off
        (``needs``: what turns them on)."""
        if not self.logprob_token_ids:
            return None
        if not logprobs_on:
            raise FieldError("logprob_token_ids", f"logprob_token_ids needs {needs}")
        return list(self.logprob_token_ids)

    def asks_for(self, name: str) -> bool:
        """Whether the client set field ``name`` to ask for something: sent,
        with a value other than the field's default here and than
        ``SamplingParams``' default of that name (``frequency_penalty`` 0,
        ``top_k`` None: a client that sends every field at its default asks
        for nothing). The one rule of "is this field set?" for the fields a
        request may not set: those this server does not implement
        (``check_supported``) and those beam search does not take
        (``check_beam_fields``). Any other value asks, an empty one too
        (``suffix: ""``, as vLLM refuses any suffix but null)."""
        if name not in self.model_fields_set:
            return False
        value = getattr(self, name)
        return value not in (type(self).model_fields[name].default, _NEUTRAL.get(name),
                             *self.ASKS_NOTHING.get(name, ()))

    def check_supported(self) -> None:
        """``InvalidRequestError`` naming the first unsupported field that is
        set (``asks_for``), or a field that only makes sense with another."""
        for name in self.UNSUPPORTED:
            if self.asks_for(name):
                raise FieldError(name, f"{name} is not supported by this server")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options needs stream: true")
        if self.cache_salt == "":
            raise FieldError("cache_salt", "cache_salt must be a non-empty string if provided")

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Whether every chunk of a stream carries the usage so far."""
        return self.include_usage and self.stream_options.continuous_usage_stats

    def token_biases(self) -> dict[int, float] | None:
        """``logit_bias`` with its keys as token ids and each bias clamped to
        OpenAI's [-100, 100] (as vLLM clamps); ``FieldError`` for a key that
        is not a decimal integer (``int()`` would also read "1_0" as 10 and
        other scripts' digits) and for a NaN bias (clamping would quietly
        make it -100, a ban). The engine checks the ids' range."""
        if self.logit_bias is None:
            return None
        biases = {}
        for key, bias in self.logit_bias.items():
            if not _DECIMAL_INT.fullmatch(key):
                raise FieldError("logit_bias", f"logit_bias keys must be token ids, got {key!r}")
            if math.isnan(bias):
                raise FieldError("logit_bias",
                                 f"logit_bias values must be numbers, got NaN for {key!r}")
            biases[int(key)] = min(100.0, max(-100.0, bias))
        return biases

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    """POST /v1/completions: ``prompt`` is a text, a list of texts, a list
    of token ids, or a list of lists of token ids."""

    prompt: str | list[str] | list[Int64] | list[list[Int64]]
    # At most the engine's max_logprobs; -1: the whole vocabulary (vLLM's).
    logprobs: int | None = Field(default=None, ge=-1)
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True  # vLLM's: false, a text prompt gets no BOS
    prompt_embeds: Any = None

    UNSUPPORTED: ClassVar[tuple[str, ...]] = (*SamplingFields.UNSUPPORTED, "suffix",
                                              "prompt_embeds")


class IdsFirstCompletionRequest(CompletionRequest):
    """``CompletionRequest`` with its prompt's members tried token ids first,
    for ``FastLane``: a list of ids then validates at once, where the text
    members first fail on every id. It accepts the same prompts with equal
    values: in pydantic's smart mode a strict match wins over a lax one,
    only ``[]`` matches two members strictly (as ``[]`` in each), and only
    the id members match anything laxly (``["1", 2]``, ``[1.0]``), one of
    them at a time. Its errors come in another order, so the route's error
    responses come from ``CompletionRequest``."""

    prompt: list[Int64] | str | list[str] | list[list[Int64]]


class FunctionDefinition(BaseModel):
    """A tool's function: ``parameters`` is the JSON schema of its arguments
    (none: it takes none). Fields OpenAI adds later pass through to the
    chat template."""

    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    """One of a request's ``tools``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionCall(BaseModel):
    """The function an earlier assistant message called: ``arguments`` is
    JSON text, as OpenAI sends it (or already an object)."""

    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any]

    @field_validator("arguments")
    @classmethod
    def _arguments_are_json(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(value, str) and value.strip():
            try:
                json.loads(value)
            except ValueError as e:
                raise ValueError(f"arguments must be JSON text ({e})") from None
        return value


class MessageToolCall(BaseModel):
    """One of an assistant message's ``tool_calls``."""

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


# A chat message's content part, read as it comes; the title names it in a
# 400's list of what a field accepts (``validation_errors``), as do the
# titles of the Responses input models.
ContentPart = Annotated[dict[str, Any], Field(title="content part")]


class ChatMessage(BaseModel):
    """One message; ``content`` is a text or a list of parts, of which only
    ``{"type": "text", "text": ...}`` parts are read. An assistant message
    may carry the ``tool_calls`` it made (its content then null); a "tool"
    message answers one of them (``tool_call_id``)."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    # At most the engine's max_logprobs; -1: the whole vocabulary (vLLM's).
    top_logprobs: int | None = Field(default=None, ge=-1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # Tool calling (serving/http/tools.py): tool_choice is "none", "auto",
    # "required" or {"type": "function", "function": {"name": ...}}.
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None  # OpenAI's older form of tools
    function_call: str | dict[str, Any] | None = None
    echo: bool = False  # vLLM's: the last message's text first, if it has the answer's role
    continue_final_message: bool = False  # vLLM's
    # vLLM's: the request's own template, served with --trust-request-chat-template
    # (``request_template.py``; a 400 otherwise).
    chat_template: str | None = None
    # vLLM's: false leaves a reasoning parser's reasoning (and the logprobs) out of the answer.
    include_reasoning: bool = True
    # vLLM's: the tokenizer's special tokens (BOS) added to the rendered prompt,
    # beside those the template writes (false: the template's alone).
    add_special_tokens: bool = False
    # vLLM's template variables (serving_chat.template_kwargs): the template's
    # ``documents`` (retrieval-augmented prompts) and ``reasoning_effort``.
    documents: list[dict[str, str]] | None = None
    reasoning_effort: ReasoningEffort | None = None
    # vLLM's: the answer also carries the rendered prompt (``prompt_text``).
    return_prompt_text: bool = False

    # vLLM's multimodal inputs' options (which vLLM refuses unless its server
    # trusts them): this server reads text alone.
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None

    UNSUPPORTED: ClassVar[tuple[str, ...]] = (*SamplingFields.UNSUPPORTED,
                                              "mm_processor_kwargs", "media_io_kwargs")
    ASKS_NOTHING: ClassVar[dict[str, tuple]] = {
        **SamplingFields.ASKS_NOTHING, "mm_processor_kwargs": ({},), "media_io_kwargs": ({},)}


class ResponseContentPart(BaseModel):
    """One part of a Responses input message's content: ``input_text`` or
    ``output_text`` with its ``text`` (other kinds are refused where the
    input is read, ``serving_responses.py``)."""

    model_config = ConfigDict(extra="allow", title="content part")

    type: str
    text: str | None = None


class ResponseInputItem(BaseModel):
    """One item of a Responses ``input`` list: ``type`` "message" (or left
    out: a ``role`` and a ``content`` that is a text or a list of parts; an
    assistant's earlier output message comes back in this shape too, its
    ``id`` and ``status`` ignored), "function_call" (an earlier call: its
    ``call_id``, ``name`` and ``arguments`` JSON text) or
    "function_call_output" (a call's result: ``call_id`` and ``output``, a
    text or a list of ``input_text`` parts). Other types are refused where
    the input is read (``responses_input.py``)."""

    model_config = ConfigDict(extra="allow", title="input item")

    type: str = "message"
    role: str | None = None
    content: str | list[ResponseContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ResponseContentPart] | None = None


class ResponseTool(BaseModel):
    """One of a Responses request's ``tools``, in that API's flat form: a
    function tool is ``{"type": "function", "name", "description",
    "parameters", "strict"}``. Other types are refused where the tools are
    read (``responses_input.py``); fields OpenAI adds later pass through to
    the chat template."""

    model_config = ConfigDict(extra="allow")

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseTextConfig(BaseModel):
    """A Responses request's ``text``: ``format`` is ``{"type": "text"}``,
    ``{"type": "json_object"}`` or ``{"type": "json_schema", "name",
    "schema", "strict"}`` (``structured.text_format_constraint``)."""

    model_config = ConfigDict(extra="allow")

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ResponseReasoning(BaseModel):
    """A Responses request's ``reasoning``, as vLLM reads it: ``effort``
    reaches the chat template as the chat's ``reasoning_effort`` does
    (``serving_chat.template_kwargs``: the template's ``reasoning_effort``,
    and ``enable_thinking`` false for "none", true else). ``summary`` (and
    its older spelling ``generate_summary``) is taken and only echoed: no
    summary is written, a reasoning item's ``summary`` stays empty and its
    text is its ``content`` (as vLLM's)."""

    model_config = ConfigDict(extra="ignore")

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


# OpenAI's ``include`` values that vLLM's Responses API accepts. Only
# "message.output_text.logprobs" asks for anything this server makes; each
# other one asks for part of an item this server never makes (built-in
# tools' calls, input images, reasoning), so leaving it out loses nothing.
INCLUDABLE = ("code_interpreter_call.outputs", "computer_call_output.output.image_url",
              "file_search_call.results", "message.input_image.image_url",
              "message.output_text.logprobs", "reasoning.encrypted_content")
OUTPUT_LOGPROBS = "message.output_text.logprobs"


class ResponsesRequest(BaseModel):
    """POST /v1/responses (OpenAI's Responses API): ``input`` is a text (one
    user message) or a list of items (messages, earlier function calls and
    their outputs); ``instructions`` a system message put first. Function
    ``tools`` and ``tool_choice`` are the chat's, in this API's spelling;
    ``include`` with "message.output_text.logprobs" asks for each output
    text's logprobs (``top_logprobs`` alternatives per token). The fields
    vLLM adds to it (``top_k``, ``seed``, ``stop``, ``ignore_eos``,
    ``repetition_penalty``, ``priority``, ``logit_bias``,
    ``skip_special_tokens``, ``include_stop_str_in_output``,
    ``structured_outputs``, ``cache_salt``) have vLLM's names and the chat's
    meaning, and so do ``reasoning.effort`` (the chat's ``reasoning_effort``,
    ``ResponseReasoning``) and vLLM's ``chat_template_kwargs``. ``store``
    and ``previous_response_id`` work with the server's response store
    (``response_store.py``); a ``store`` left true with the store off
    is served without storing, as vLLM serves it, and ``store`` null stores
    nothing, as vLLM reads it (false); ``background``
    runs the response on while the call returns, which needs the store
    (``responses_background.py``); ``truncation`` "auto" cuts an input too
    long for the context, as vLLM's does. ``user``, ``metadata``,
    ``safety_identifier``, ``prompt_cache_key``, ``service_tier`` and
    ``max_tool_calls`` are accepted and change nothing but the echo."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[ResponseInputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: ResponseTextConfig | None = None
    previous_response_id: str | None = None
    store: bool | None = True
    stream: bool | None = False
    user: str | None = None
    metadata: dict[str, str] | None = None
    tools: list[ResponseTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    include: list[str] | None = None
    # With include "message.output_text.logprobs": at most the engine's
    # max_logprobs; -1: the whole vocabulary (the chat's rule, vLLM's).
    top_logprobs: int | None = Field(default=None, ge=-1)
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    top_k: int | None = None
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    repetition_penalty: float | None = None
    priority: Int64 = 0
    logit_bias: dict[str, float] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: dict[str, Any] | None = None  # or text.format, not both
    # The chat's (a non-empty string): only requests of one salt share
    # prefix-cache blocks.
    cache_salt: str | None = None
    background: bool | None = False

    # Its ``effort`` is the chat's ``reasoning_effort`` (vLLM's rule).
    reasoning: ResponseReasoning | None = None
    # vLLM's: the chat's template variables (its ``chat_template`` key the
    # request's own template, under the chat's rule: ``request_template.py``).
    chat_template_kwargs: dict[str, Any] | None = None

    # "auto": an input longer than the context keeps its last tokens, as
    # many as fit beside max_output_tokens (vLLM's rule,
    # ``serving_responses.truncated_input``); "disabled" (vLLM's default):
    # it is refused; null: as "auto" (``truncates``).
    truncation: Literal["auto", "disabled"] | None = "disabled"
    # The most calls to built-in tools a response may make: taken and
    # echoed, as vLLM's; this server runs no built-in tool (function calls
    # are the client's to run), so it limits nothing.
    max_tool_calls: int | None = None

    # Fields OpenAI defines that this server does not serve (vLLM refuses
    # ``prompt``; it has no ``conversation`` nor ``context_management``): a
    # value other than one of those given here (which ask for nothing) is
    # refused.
    prompt: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    context_management: list[Any] | None = None
    UNSUPPORTED: ClassVar[dict[str, tuple]] = {
        "prompt": (None,), "conversation": (None,), "context_management": (None, [])}

    def check_supported(self) -> None:
        """``FieldError`` naming the first field set to a value this server
        does not serve (prompt, conversation, ...), an ``include`` value vLLM
        does not take and an empty ``cache_salt`` (vLLM refuses it)."""
        for name, harmless in self.UNSUPPORTED.items():
            if getattr(self, name) not in harmless:
                raise FieldError(name, f"{name} is not supported by this server")
        if self.text is not None and self.text.verbosity not in (None, "medium"):
            raise FieldError("text.verbosity", "text.verbosity is not supported by this server")
        for i, value in enumerate(self.include or []):
            if value not in INCLUDABLE:
                raise FieldError(f"include.{i}", f"include {value!r} is not supported by this "
                                                 f"server (it takes {', '.join(INCLUDABLE)})")
        if self.cache_salt == "":
            raise FieldError("cache_salt", "cache_salt must be a non-empty string if provided")

    @property
    def stores(self) -> bool:
        """Whether the client lets the response be stored: ``store`` true
        (its default). As vLLM reads it, null does not: vLLM's request
        model takes null for ``store`` and every use of it tests its truth."""
        return self.store is True

    @property
    def truncates(self) -> bool:
        """Whether an input too long for the context is cut to fit
        (``truncation``): anything but "disabled", null too, as vLLM reads
        it (its default is "disabled", and every use of the field tests
        for that value alone). A Response echoes "auto" for a null one, the
        rule it was served under (vLLM's Response takes only "auto" or
        "disabled" there)."""
        return self.truncation != "disabled"

    @property
    def output_logprobs(self) -> bool:
        """Whether each output text carries its tokens' logprobs."""
        return OUTPUT_LOGPROBS in (self.include or [])

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class TokenizeRequest(BaseModel):
    """POST /tokenize (vLLM's shape): a ``prompt``, or chat ``messages``
    rendered with the model's chat template (or the request's own
    ``chat_template``, as the chat route takes it)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    tools: list[ChatTool] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """POST /detokenize (vLLM's shape)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[Int64]


class FieldError(InvalidRequestError):
    """A bad value of one request field: ``param`` is the field's path as
    the client sent it, the error body's ``param``."""

    def __init__(self, param: str, message: str):
        super().__init__(message, param=param)


ErrorType = Literal["invalid_request_error", "server_error", "service_unavailable"]


def error_body(message: str, type: ErrorType = "invalid_request_error",
               param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
