"""``FastLane``: the generation routes' bodies parsed and validated in one
pass, without FastAPI's request machinery.

A FastAPI route reads a JSON body into Python objects (``json_body``), then
validates them against the route's model, behind its middleware stack and its
dependency solver: for a prompt of a few hundred token ids that is most of
the time the server spends before the engine sees the request. This ASGI
layer sits between the guards and the FastAPI app and serves ``POST`` to
the paths it is given itself when the body is JSON that validates:
pydantic-core parses and validates the raw bytes at once
(``model_validate_json``), the route's handler is called directly and its
response sent. Every other request, and every body that does not validate,
goes to the FastAPI app with its body replayed, so every error response
(400 for a malformed or invalid body included) is the one FastAPI's route
gives, and the app's other routes and its OpenAPI schema are untouched.

Invariant: a body the lane accepts is one the FastAPI route accepts, and
validates to an equal request. The lane takes only what FastAPI would read
as JSON (no ``Content-Type``, or a JSON one), and its models
accept the same bodies as the routes' (``create_app`` gives it
``CompletionRequest``'s twin ``IdsFirstCompletionRequest``, and
``ChatCompletionRequest`` and ``ResponsesRequest`` themselves).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.http.guards import content_type_of, is_json_media_type

Handler = Callable[[BaseModel, Request], Awaitable[Response]]


@dataclass(frozen=True)
class LaneRoute:
    """What the lane validates a path's body against, and who answers it."""

    model: type[BaseModel]
    handler: Handler


class FastLane:
    def __init__(self, app: ASGIApp, routes: dict[str, LaneRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        try:
            request = None if body is None else route.model.model_validate_json(body)
        except ValidationError:
            request = None
        if request is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        response = await route.handler(request, Request(scope, receive))
        await response(scope, receive, send)

    def _route(self, scope: Scope) -> LaneRoute | None:
        """The lane's route for this request, or None (FastAPI's to answer)."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        route = self.routes.get(scope["path"])
        return route if route is not None and _is_json(scope) else None


def _is_json(scope: Scope) -> bool:
    """Whether FastAPI reads this body as JSON: no ``Content-Type``, or a
    JSON one (``guards.is_json_media_type``)."""
    content_type = content_type_of(scope)
    return content_type is None or is_json_media_type(content_type)


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's messages up to its body's end, and the body (None when
    the client left first)."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        if not message.get("more_body", False):
            break
    if len(messages) == 1:
        return messages, messages[0].get("body", b"")
    return messages, b"".join(m.get("body", b"") for m in messages)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that gives ``messages`` first, then the connection's."""
    async def replayed() -> Message:
        return messages.pop(0) if messages else await receive()

    return replayed
