"""What every route needs: the link to the engine, the model's tokenizer
and limits, the metrics, the served model's name, and the tool-call parser
that tool_choice "auto" reads answers with (None: "auto" is refused)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from checkpoint.tokenizer import Tokenizer
from serving.async_client import AsyncEngineClient
from serving.http.logprobs import LogprobsFormatter
from serving.http.metrics import Metrics
from serving.http.tools import ToolCallReader


@dataclass
class ServerState:
    link: AsyncEngineClient
    tokenizer: Tokenizer
    model_name: str
    max_model_len: int
    metrics: Metrics
    logprobs: LogprobsFormatter
    tool_call_parser: Callable[[], ToolCallReader] | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, model: str | None) -> None:
        """A request may name the served model or none; ``ValueError`` else."""
        if model is not None and model != self.model_name:
            raise UnknownModelError(f"the model {model!r} is not served here; "
                                    f"this server serves {self.model_name!r}")


class UnknownModelError(ValueError):
    """A request named a model this server does not serve."""
