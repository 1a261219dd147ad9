"""JSON bodies read by one parser on every route: pydantic-core's (jiter),
the one ``FastLane`` reads with.

FastAPI reads a route's body with ``json.loads``, which takes strings that
are not Unicode text: a lone surrogate, escaped (``"\\ud800"``) or encoded
in the bytes. Such a string passes the request models (a ``str`` is a
``str``) and breaks the first code that needs text: the tokenizer refuses
it, an error message quoting it cannot be written as UTF-8; both were
answered 500. jiter refuses it as invalid JSON, as it refuses invalid
UTF-8, so ``JsonBodyRoute`` reads every body with it (``read_json``): such
a body is a 400 that says where its JSON breaks, before a route sees it,
and the lane and the routes read a body alike.

Invariant: every string a route sees is valid Unicode (no surrogates), so
it can be tokenized and written back as UTF-8. A body is UTF-8 text (RFC
8259 8.1); a leading UTF-8 byte-order mark is skipped, as ``json.loads``
skips it.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.routing import APIRoute
from pydantic_core import from_json
from starlette.requests import Request
from starlette.responses import Response


def read_json(body: bytes) -> Any:
    """The value of a JSON body; ``json.JSONDecodeError`` (jiter's message,
    which says what broke where) for one that is not JSON, not UTF-8, or
    holds a lone surrogate."""
    try:
        return from_json(body.removeprefix(codecs.BOM_UTF8))
    except ValueError as e:
        raise json.JSONDecodeError(str(e), "", 0) from None


class JsonBodyRequest(Request):
    """A request whose ``json()`` is ``read_json`` of its body."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = read_json(await self.body())
        return self._json


class JsonBodyRoute(APIRoute):
    """A FastAPI route that reads its JSON body with ``read_json``; FastAPI
    answers its ``JSONDecodeError`` as any malformed body (the app's 400)."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(JsonBodyRequest(request.scope, request.receive))

        return handle
