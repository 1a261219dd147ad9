"""A streamed chat answer's first chunk (the role chunk) goes out with
the first output, as vLLM's server sends it, not when the engine accepts
the request: a client's time to the first chunk (``bench serve``'s TTFT,
vLLM's definition) is then its time to the first token. The app is served
by uvicorn on 127.0.0.1 over an engine link that accepts at once and
sends the output only when the test releases it; a reader thread notes,
for each event line, whether the output had been released when it came."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from checkpoint.tiny_model import ensure_tiny_model
from checkpoint.tokenizer import Tokenizer
from ipc.engine_messages import Delta
from serving.http.app import create_app
from serving.http.http_server import HttpServer
from tests.helpers.engine_links import AcceptingLink


class HeldLink(AcceptingLink):
    """Accepts each request at once; its output ("hi", finished) waits
    for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list = []
        self.released = threading.Event()

    def submit(self, request_id, prompt_token_ids, params, queue, *args, **kwargs) -> None:
        super().submit(request_id, prompt_token_ids, params, queue, *args, **kwargs)
        self.held.append((asyncio.get_running_loop(), queue, request_id))

    def release(self) -> None:
        self.released.set()
        for loop, queue, request_id in self.held:
            loop.call_soon_threadsafe(queue.put_nowait, Delta(
                request_id=request_id, token_ids=[104, 105], text="hi", finished=True,
                finish_reason="stop"))


@pytest.mark.timeout(60)
def test_the_role_chunk_comes_with_the_first_output():
    link = HeldLink()
    app = create_app(link, Tokenizer.from_dir(ensure_tiny_model()), ["tiny"], 4096)
    server = HttpServer(app, "127.0.0.1", 0)
    server.start()
    seen: list[tuple[dict, bool]] = []

    def read() -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
                "stream": True, "max_completion_tokens": 2}
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body,
                          timeout=30) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    seen.append((json.loads(line[6:]), link.released.is_set()))

    try:
        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 20
        while not link.held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert link.held, "the request never reached the engine link"
        time.sleep(0.5)  # room for a chunk sent at acceptance to arrive
        link.release()
        reader.join(20)
    finally:
        server.stop()
    deltas = [(chunk["choices"][0]["delta"], released) for chunk, released in seen]
    assert deltas[0] == ({"role": "assistant", "content": ""}, True)
    assert [d for d, _ in deltas[1:]] == [{"content": "hi"}]
    assert all(released for _, released in deltas)
