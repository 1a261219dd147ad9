"""One log line per HTTP request: method, path, status, duration (ms).

An ASGI wrapper outside every other layer, so refused requests (401, 413)
and errors are logged too. Logged at INFO on the ``tprun.access`` logger
when the response has been sent; ``--no-access-log`` leaves it out.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("tprun.access")


class AccessLog:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = 0

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            client = scope.get("client")
            logger.info("%s %s %s %d %.1f ms", client[0] if client else "-", scope["method"],
                        scope["path"], status, (time.monotonic() - start) * 1000)
