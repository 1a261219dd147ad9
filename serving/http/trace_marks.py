"""The HTTP front end's latency-trace marks (``ipc.trace``) at the ASGI edge.

``TracedApp`` wraps the whole app, outside every other layer, only when
the trace is on (``create_app``): ``http_receive`` when the server calls the
app for a request, ``http_chunk_written`` each time a body chunk is handed
to the server (for a stream: one server-sent event or more), just before,
as every mark of a send is (``ipc.trace``).
"""

from __future__ import annotations

from ipc import trace


class TracedApp:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        trace.mark("http_receive", scope["path"])

        async def send_and_mark(message) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                trace.mark("http_chunk_written")
            await send(message)

        await self.app(scope, receive, send_and_mark)
