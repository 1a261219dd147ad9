"""Stand-ins for the engine and the engine server of ``tprun serve``
(``launch.cli.run_serve``), so that ``launch.cli.main`` runs a serve in
process with no model loaded. They note what happened to them, in order,
in one list: "engine started", "serving", "server closed", "engine shut
down". A test makes its moment happen through two hooks: ``on_start``
runs inside the engine's start (before "engine started" is noted; an
exception from it is the engine's), ``on_serve`` once the server serves,
given the server (its ``stopped`` turns true when the CLI stops it)."""

from __future__ import annotations

from collections.abc import Callable


def stand_in_engine_and_server(monkeypatch, on_start: Callable[[], None] = lambda: None,
                               on_serve: Callable[[object], None] = lambda server: None
                               ) -> list[str]:
    """Put the stand-ins in the place of ``LLMEngine`` and ``EngineServer``
    (undone with ``monkeypatch``); returns the list they note events in.
    The server's ``close`` removes its endpoint's directory, as the real
    one's does."""
    import engine.llm_engine
    import serving.endpoint

    events: list[str] = []

    class Engine:
        def __init__(self, config):
            on_start()
            events.append("engine started")

        def shutdown(self):
            events.append("engine shut down")

    class Server:
        address, key_file = "ipc://test", "key"

        def __init__(self, engine, endpoint, endpoint_file, secret):
            self.endpoint = endpoint
            self.stopped = False

        def serve(self):
            events.append("serving")
            on_serve(self)

        def stop(self):
            self.stopped = True

        def close(self, term_context):
            self.endpoint.cleanup()
            events.append("server closed")

    monkeypatch.setattr(engine.llm_engine, "LLMEngine", Engine)
    monkeypatch.setattr(serving.endpoint, "EngineServer", Server)
    return events
