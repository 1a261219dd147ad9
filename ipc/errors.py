"""Errors that cross a process line, kept with the messages so that every
side can raise and recognise them without importing the others:

- ``InvalidPlanError``: the runner's refusal of a plan (the engine side
  names it without importing the runner);
- ``InvalidRequestError``: a request refused for what it asks, the
  client's error. The checkpoint (tokenizer, chat template), the engine
  (sampling parameters, the request check, structured outputs) and the
  servers all raise it, and the engine endpoint tells its clients which
  refusals are of this kind (``RequestError.invalid_request``).

The rule every server follows: an ``InvalidRequestError`` (or a subclass)
is the client's error, answered with its message (HTTP 400, OpenAI's
``invalid_request_error``); any other exception while a request is served,
a plain ``ValueError`` included, is the server's own failure (HTTP 500,
logged with its traceback, its text not sent), so an internal bug never
passes for a bad request.
"""

from __future__ import annotations


class InvalidPlanError(ValueError):
    """The plan contradicts the runner's state; nothing was applied."""


class InvalidRequestError(ValueError):
    """A request that cannot be served as it was sent: its message says
    why, in terms the client can act on. ``param``: the request field at
    fault, as the client spelled it (OpenAI's error ``param``; None: no
    one field); ``code``: OpenAI's error code, where one applies (a
    subclass may fix its own). A ``ValueError``, so that callers of the
    Python API that catch ``ValueError`` catch it too."""

    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code
