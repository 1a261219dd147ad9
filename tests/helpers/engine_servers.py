"""An ``LLM``'s engine behind a real engine endpoint (``EngineServer``)
whose loop runs in a thread of the test process, for tests that talk to it
as a client would."""

from __future__ import annotations

import contextlib
import threading

from engine import LLM
from ipc.auth import new_secret
from serving.endpoint import Endpoint, EngineServer


@contextlib.contextmanager
def serving(llm: LLM):
    """``llm``'s engine behind an endpoint whose loop runs in a thread;
    yields (server, secret). On exit the loop stops and the server closes,
    leaving no thread behind."""
    secret = new_secret()
    server = EngineServer(llm.engine, Endpoint.create(), secret=secret)
    loop = threading.Thread(target=server.serve, name="engine-loop")
    loop.start()
    try:
        yield server, secret
    finally:
        server.stop()
        loop.join(timeout=60)
        server.close()
    assert not loop.is_alive()
