"""Whose failure is it: the one rule that turns an exception raised while a
request is served into OpenAI's error shape, for a whole answer
(``app._answer``) and for a stream already under way (its last event:
``streaming.event_lines``, ``serving_responses``).

- ``InvalidRequestError`` (``ipc/errors.py``) and every subclass (a bad
  field, a prompt too long, a grammar that does not compile, a chat
  template that refuses the messages, the engine's refusal of what a
  request asks): the client's error, 400 ``invalid_request_error`` with its
  message, ``param`` and ``code``; of those, a model, a stored response or
  a LoRA adapter (to unload, or to load from a path that is no directory)
  this server does not hold is a 404.
- ``EngineStoppedError``: 503, the reason's first line.
- ``GenerationError`` (a choice the engine ended with finish reason
  "error"): 500 ``server_error`` with its message, as vLLM answers that
  reason; logged where it was raised, on one line (no traceback: no bug of
  the server's is behind it).
- Anything else, a plain ``ValueError`` included: the server's own failure,
  500 ``server_error``. Its traceback is logged here and its text is not
  sent, so an internal bug (an infinity the JSON encoder refuses, a broken
  invariant) is found in the log, never answered as the client's mistake.
"""

from __future__ import annotations

import logging

from ipc.errors import InvalidRequestError
from ipc.lora_adapter import LoRAAdapterNotFoundError
from serving.http.generation import GenerationError
from serving.http.lora_updates import UnknownLoRAAdapterError
from serving.http.protocol import error_body
from serving.http.response_store import UnknownResponseError
from serving.http.state import UnknownModelError
from serving.protocol_core import EngineStoppedError

logger = logging.getLogger(__name__)

SERVER_FAILURE = "the server failed to handle this request"


def error_answer(e: Exception) -> tuple[int, dict]:
    """The HTTP status and OpenAI error body for ``e`` (see the module's
    rule); a failure of the server's own is logged with its traceback."""
    if isinstance(e, (UnknownModelError, UnknownResponseError, UnknownLoRAAdapterError,
                      LoRAAdapterNotFoundError)):
        return 404, error_body(str(e), param=e.param, code=e.code)
    if isinstance(e, InvalidRequestError):
        return 400, error_body(str(e), param=e.param, code=e.code)
    if isinstance(e, EngineStoppedError):
        return 503, error_body(e.client_message(), "service_unavailable", code=503)
    if isinstance(e, GenerationError):
        return 500, error_body(str(e), "server_error", code=500)
    logger.error("a request failed inside the server", exc_info=e)
    return 500, error_body(SERVER_FAILURE, "server_error", code=500)
