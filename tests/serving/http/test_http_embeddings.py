"""POST /v1/embeddings of ``tprun serve --runner pooling``, through the
official ``openai`` client: float and base64 answers equal transformers'
final-normed hidden states of the same checkpoint (last token, normalized);
refusals are OpenAI-shaped 400s after which the server goes on serving;
the generation routes answer 404 on a pooling server, and /v1/embeddings
404 on a generating one, as vLLM registers each task's routes only."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from tests.helpers.hf_embeddings import hf_last_token_embeddings
from tests.helpers.hf_models import save_embedding_llama
from tests.helpers.http_utils import metric, recording_app, serving_pooling_model

IDS = [[5, 17, 99, 3], list(range(1, 40)), [42]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_embedding_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    with serving_pooling_model(tmp_path_factory.mktemp("embed"), model,
                               "--runner", "pooling") as served:
        yield served


def _reference(model: str, ids: list[int]) -> np.ndarray:
    return hf_last_token_embeddings(model, [ids])[0]


@pytest.mark.timeout(180)
def test_float_and_base64_embeddings_match_transformers(client, model):
    # Left unset, the client asks for base64 and decodes it to floats itself.
    default = client.embeddings.create(model=model, input=IDS)
    floats = client.embeddings.create(model=model, input=IDS, encoding_format="float")
    b64 = client.embeddings.create(model=model, input=IDS, encoding_format="base64")
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(map(len, IDS))
    for ids, d, f, b in zip(IDS, default.data, floats.data, b64.data, strict=True):
        want = _reference(model, ids)
        np.testing.assert_allclose(d.embedding, want, atol=2e-5)
        np.testing.assert_allclose(f.embedding, want, atol=2e-5)
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(b.embedding), "<f4"), want,
                                   atol=2e-5)


@pytest.mark.timeout(180)
def test_text_inputs_embed_their_tokens(client, server, model):
    texts = ["hello embeddings", "a second, longer text of more than sixteen bytes"]
    got = client.embeddings.create(model=model, input=texts, user="someone")
    for text, item in zip(texts, got.data, strict=True):
        ids = httpx.post(f"{server.url}/tokenize",
                         json={"model": model, "prompt": text}).json()["tokens"]
        np.testing.assert_allclose(item.embedding, _reference(model, ids), atol=2e-5)
    one = client.embeddings.create(model=model, input=texts[0])
    np.testing.assert_allclose(one.data[0].embedding, got.data[0].embedding, atol=1e-6)


@pytest.mark.timeout(180)
def test_refusals_are_400s_and_the_server_goes_on(client, model):
    with pytest.raises(openai.BadRequestError) as empty:
        client.embeddings.create(model=model, input="")
    assert empty.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as long:
        client.embeddings.create(model=model, input=[list(range(1, 70))])
    assert long.value.body["code"] == "context_length_exceeded"
    assert "maximum context length is 64" in long.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="matryoshka"):
        client.embeddings.create(model=model, input=[IDS[0]], dimensions=8)
    again = client.embeddings.create(model=model, input=[IDS[0]])
    np.testing.assert_allclose(again.data[0].embedding, _reference(model, IDS[0]), atol=2e-5)


@pytest.mark.timeout(180)
def test_generation_routes_are_not_served(client, model):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=model, prompt="hi", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "h"}])


@pytest.mark.timeout(60)
def test_generating_server_does_not_serve_embeddings(tiny_dir):
    with recording_app(tiny_dir) as app:
        answer = app.http.post("/v1/embeddings", json={"input": "hi"})
        assert answer.status_code == 404
        assert "error" in answer.json()


def _finished(server, reason: str) -> float:
    """``tprun:request_success_total`` for ``reason``, read from /metrics."""
    return metric(server.url, "tprun:request_success_total", {"finished_reason": reason})


@pytest.mark.timeout(180)
def test_each_embedded_input_counts_as_a_finished_request(client, server, model):
    # As vLLM counts a pooling request: finished "stop", one per input.
    before = _finished(server, "stop")
    client.embeddings.create(model=model, input=IDS)
    assert _finished(server, "stop") == before + len(IDS)
