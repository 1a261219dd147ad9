"""uvicorn's answer to bytes it cannot read as HTTP, in OpenAI's error shape.

A request line or header that does not parse (``GARBAGE``, a header
without a colon, a name with a space) never reaches the app: uvicorn's
protocol class answers it itself, a 400 with the plain-text body "Invalid
HTTP request received." that closes the connection. Neither uvicorn's
configuration nor its parsers (httptools and h11 only raise) offer a hook
for that body, so the server runs uvicorn's own protocol class, the one
its "auto" setting picks (httptools where installed, else h11), with that
one answer written as every other error of this server:
``{"error": {"message", "type": "invalid_request_error", "param": null,
"code": null}}`` (``protocol.error_body``), still a 400 with uvicorn's
message and default headers (date, server), still closing the connection.
Everything else is uvicorn's: the parsing, the warning it logs, keep-alive.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.server import ServerState

from serving.http.protocol import error_body


class JsonBadRequest:
    """Mixed in before one of uvicorn's HTTP protocol classes (h11's or
    httptools'): both call ``send_400_response(msg)`` for a request they
    cannot parse, and close the connection after it, so the answer is
    written whole to the transport, past the parser's state."""

    transport: asyncio.Transport
    server_state: ServerState

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(error_body(msg)).encode()
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n",
                 b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


class JsonErrorsProtocol(JsonBadRequest, AutoHTTPProtocol):
    """The protocol class uvicorn's "auto" picks, answering what it cannot
    parse in OpenAI's error shape (module docstring)."""
