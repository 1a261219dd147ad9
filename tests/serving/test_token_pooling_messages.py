"""A token-level pooling request's rows (one a prompt token) over the
engine endpoint, whose every message is bounded (``MAX_MESSAGE_BYTES``,
ZeroMQ's MAXMSGSIZE on both sockets: a larger frame cuts the connection
and everything after it on that connection is lost). Here the bound is
made small so that a short prompt reaches it: a request whose rows a
message cannot carry is refused up front (400-shaped ``RequestError``)
and the engine goes on answering that client; requests whose rows each
fit but together do not, finishing in the same step, are all answered
(their deltas spread over several messages)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from engine import LLM
from ipc import serde
from ipc.engine_messages import Delta, RequestAccepted, RequestError
from serving import endpoint as endpoint_module
from serving import protocol_core
from serving.async_client import AsyncEngineClient
from tests.helpers.engine_servers import serving
from tests.helpers.hf_embeddings import hf_token_hidden_states
from tests.helpers.hf_models import save_embedding_llama

HIDDEN = 64
BOUND = 8 << 10  # bytes a message may take; a row is 256 bytes


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return save_embedding_llama(tmp_path_factory.mktemp("llama"))




async def _pool(address: str, secret: bytes, prompts: list[list[int]]) -> list:
    """Each prompt's last item (its ``RequestError`` or finishing ``Delta``)
    from one client over the endpoint's socket (not inproc: the bound holds),
    None where nothing came within 20 s."""
    client = AsyncEngineClient(address, secret)
    await client.start()
    queues = [asyncio.Queue() for _ in prompts]
    try:
        for i, (prompt, queue) in enumerate(zip(prompts, queues)):
            client.submit(f"r{i}", prompt, {}, queue, pooling_params={"task": "token_embed"})
        ends = []
        for queue in queues:
            try:
                while True:
                    item = await asyncio.wait_for(queue.get(), 20)
                    if isinstance(item, RequestError) or (isinstance(item, Delta)
                                                          and item.finished):
                        ends.append(item)
                        break
                    assert isinstance(item, RequestAccepted)
            except asyncio.TimeoutError:
                ends.append(None)
        return ends
    finally:
        await client.close()


@pytest.mark.timeout(180)
def test_rows_a_message_cannot_carry_are_refused_and_rows_that_fit_all_arrive(embedder,
                                                                             monkeypatch):
    monkeypatch.setattr(endpoint_module, "MAX_MESSAGE_BYTES", BOUND)
    monkeypatch.setattr(protocol_core, "MAX_MESSAGE_BYTES", BOUND)
    monkeypatch.setattr(serde, "MAX_POOLED_BYTES", BOUND // 2)
    too_long = [(i * 5) % 300 + 1 for i in range(40)]  # 40 rows: 10,240 bytes
    fitting = [[(i * 7 + k) % 300 + 1 for i in range(12)] for k in range(3)]  # 3,072 each
    with LLM(model=embedder, device="cpu", executor="uni", runner="pooling", block_size=16,
             max_model_len=64, max_num_batched_tokens=64) as llm, \
            serving(llm) as (server, secret):
        refused, = asyncio.run(_pool(server.address, secret, [too_long]))
        answered = asyncio.run(_pool(server.address, secret, fitting))
    assert isinstance(refused, RequestError) and refused.invalid_request, refused
    assert "token_embed" in refused.error and "bytes" in refused.error
    for delta, ids in zip(answered, fitting, strict=True):
        assert isinstance(delta, Delta), delta
        rows = np.frombuffer(delta.embedding, "<f4").reshape(len(ids), HIDDEN)
        want = hf_token_hidden_states(embedder, ids)
        np.testing.assert_allclose(rows, want / np.linalg.norm(want, axis=1, keepdims=True),
                                   atol=2e-5)


def test_deltas_are_cut_into_messages_of_at_most_the_pooled_bound(monkeypatch):
    monkeypatch.setattr(serde, "MAX_POOLED_BYTES", 100)

    def delta(name: str, size: int | None) -> Delta:
        return Delta(request_id=name, token_ids=[], text="", finished=True,
                     embedding=None if size is None else bytes(size))

    deltas = [delta("a", 60), delta("g", None), delta("b", 40), delta("c", 1), delta("d", 100),
              delta("e", 100)]
    runs = endpoint_module._by_pooled_size(deltas)
    assert [[d.request_id for d in run] for run in runs] == [["a", "g", "b"], ["c"], ["d"],
                                                            ["e"]]
