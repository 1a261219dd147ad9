"""``POST /invocations``: vLLM's SageMaker-compatible route, which runs the
body as the first request type it validates as, on that type's route.

The order is vLLM's, of the types this server serves: a generating model's
chat completion, then completion; a pooling model's embedding (an
embedding model) or classification (a classifier), then rerank, score and
the generic pooling request. A body is a type's when its request model
validates it (the checks of the model itself: a check the route makes
later, such as the context length, is that route's answer) and, for a type
whose prompt may come in one of several fields (a classification or
pooling request's ``input`` or ``messages``: vLLM's two request types of
each route), it holds one of them. A body no type
validates is a 400 with vLLM's message, naming the types tried; a body
that is not JSON is the app's malformed-body 400. The route's body must be
sent as JSON, as vLLM's (``JSON_BODY_ROUTES``: 415 otherwise).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from serving.http.protocol import error_body

INVOCATIONS_ROUTE = "/invocations"
Handler = Callable[[BaseModel, Request], Awaitable[Response]]


class InvocationType(NamedTuple):
    """A request type: its model, the handler of its route, and the fields
    of which a body must hold one (none: the model alone decides)."""

    model: type[BaseModel]
    handler: Handler
    prompt_fields: tuple[str, ...] = ()

    def accepts(self, body) -> BaseModel | None:
        """``body`` as this type's request, or None when it is not one."""
        if self.prompt_fields and not (
            isinstance(body, dict) and any(f in body for f in self.prompt_fields)
        ):
            return None
        try:
            return self.model.model_validate(body)
        except ValidationError:
            return None


class Invocations:
    """The route's handler over ``table``, the types in the order they are
    tried."""

    def __init__(self, table: Sequence[InvocationType]) -> None:
        self.table = tuple(table)

    async def __call__(self, raw: Request) -> Response:
        try:
            body = await raw.json()
        except json.JSONDecodeError as e:
            return JSONResponse(error_body(f"the body is not valid JSON ({e})"), status_code=400)
        for kind in self.table:
            request = kind.accepts(body)
            if request is not None:
                return await kind.handler(request, raw)
        names = [kind.model.__name__ for kind in self.table]
        return JSONResponse(
            error_body(f"Cannot find suitable handler for request. Expected one of: {names}"),
            status_code=400,
        )
