"""An answer's ``id``, as vLLM's server makes it: the route's prefix
("cmpl-", "chatcmpl-") before the request's ``X-Request-Id`` header, else
its body's ``request_id`` (vLLM's field), else a fresh random id.

The id names the answer alone: the engine's requests keep ids of their
own, so two answers that share an id never share anything else.
"""

from __future__ import annotations

import secrets

from starlette.requests import Request

from serving.http.protocol import SamplingFields


def response_id(prefix: str, raw: Request, request: SamplingFields) -> str:
    given = raw.headers.get("x-request-id", request.request_id)
    return prefix + (secrets.token_hex(12) if given is None else given)
