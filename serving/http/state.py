"""What every route needs: the link to the engine, the model's tokenizer
and limits, the metrics, the names the model is served under, the
tool-call parser that tool_choice "auto" reads answers with (None: "auto" is
refused), the reasoning parser that splits a reasoning model's answers (None:
none), whether a request's own chat template is served, the Responses
API's response store (None: off) and its responses that run in the
background."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from checkpoint.tokenizer import Tokenizer
from engine.prometheus_metrics import Metrics
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest
from serving.async_client import AsyncEngineClient
from serving.http.logprobs import LogprobsFormatter
from serving.http.reasoning import ReasoningParser
from serving.http.response_store import ResponseStore
from serving.http.responses_background import BackgroundRuns
from serving.http.tools import ToolCallReader


@dataclass
class ServerState:
    link: AsyncEngineClient
    tokenizer: Tokenizer
    served_names: tuple[str, ...]  # the first names the model in metrics and answers
    max_model_len: int
    metrics: Metrics
    logprobs: LogprobsFormatter
    tool_call_parser: type[ToolCallReader] | None = None
    reasoning_parser: ReasoningParser | None = None
    # Unset sampling fields take these (``LLMEngine.sampling_defaults``).
    sampling_defaults: dict = field(default_factory=dict)
    # The model's end-of-sequence ids (``LLMEngine``'s: the tokenizer's and
    # generation_config.json's), where beam search ends a sequence.
    eos_token_ids: tuple[int, ...] = ()
    # The engine's top logprobs per token at most (-1: any), checked here
    # too (``sampling.check_logprobs``) so a 400 names the request's own field.
    max_logprobs: int = -1
    # The model's vocabulary, what a request's -1 (the whole vocabulary)
    # asks for, set where the engine's max_logprobs is (None: unknown).
    vocab_size: int | None = None
    # vLLM's ``--stream-interval``: the least new tokens a stream's chunk
    # groups; a request's ``stream_interval`` may only raise it.
    stream_interval: int = 1
    # vLLM's ``--chat-template``: the chat routes' template in place of the
    # model's (None: the model's), which a request's ``chat_template`` field
    # goes before and its ``chat_template_kwargs`` key does not
    # (``request_template.py``).
    chat_template: str | None = None
    # vLLM's ``--trust-request-chat-template``: a request's own chat template
    # is rendered (``request_template.py``), not refused.
    trust_request_chat_template: bool = False
    # vLLM's ``--response-role``: the role of a chat answer after a
    # generation prompt (``echo.answer_role``).
    response_role: str = "assistant"
    response_store: ResponseStore | None = None
    background: BackgroundRuns = field(default_factory=BackgroundRuns)
    # vLLM's ``--lora-modules``: the LoRA adapters served as models of their
    # own, by name (a request naming one runs with it); with runtime updates
    # on, those loaded and unloaded over HTTP too (``lora_updates.py``).
    lora_modules: dict[str, LoRARequest] = field(default_factory=dict)
    # A classifier's label names by class index (config.json's ``id2label``):
    # /classify's ``label``; empty for another model.
    labels: tuple[str, ...] = ()
    # A pooling model's task: "classify" scores pairs as a cross-encoder
    # (/score, /rerank), "embed" by the cosine of embeddings.
    pooling_task: str = "embed"
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        return self.served_names[0]

    def check_model(self, model: str | None) -> None:
        """A request may name the model by any served name or a LoRA
        module's name, or not at all; ``UnknownModelError`` else."""
        if model is not None and model not in self.served_names \
                and model not in self.lora_modules:
            names = " or ".join(map(repr, (*self.served_names, *self.lora_modules)))
            raise UnknownModelError(f"the model {model!r} is not served here; "
                                    f"this server serves {names}")

    def lora_request(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter a request naming ``model`` runs with (None: the
        base model); ``UnknownModelError`` for a name not served now (an
        adapter unloaded since the request's ``check_model``: never the base
        model under the adapter's name)."""
        self.check_model(model)
        return self.lora_modules.get(model) if model is not None else None

    def shown_model(self, model: str | None) -> str:
        """The ``model`` of an answer: the name the request used (vLLM's),
        else the first served name."""
        return model or self.model_name


class UnknownModelError(InvalidRequestError):
    """A request named a model this server does not serve (HTTP 404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="model", code="model_not_found")
