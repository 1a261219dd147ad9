"""POST /v1/embeddings of ``tprun serve --runner pooling``, through the
official ``openai`` client: float and base64 answers equal transformers'
final-normed hidden states of the same checkpoint (last token, normalized);
vLLM's ``embed_dtype`` and ``endianness`` (base64, and the binary
"bytes" and "bytes_only" answers, through httpx) carry the float answer's
values rounded to the dtype, decoded here from their bits;
refusals are OpenAI-shaped 400s after which the server goes on serving;
the generation routes answer 404 on a pooling server, and /v1/embeddings
404 on a generating one, as vLLM registers each task's routes only."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import openai
import pytest

from tests.helpers.embed_dtypes import HALF_STEPS, TORCH_DTYPES, decoded, rounded
from tests.helpers.hf_embeddings import hf_last_token_embeddings
from tests.helpers.hf_models import save_embedding_llama
from tests.helpers.http_utils import metric, recording_app, serving_pooling_model

IDS = [[5, 17, 99, 3], list(range(1, 40)), [42]]
# Less than a block and a step: no prefix-cache hit and no chunk, so every
# request of it alone computes the same floats, to the bit.
SHORT = [5, 17, 99, 3, 8, 61, 7]


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


def _float_answer(server, model, ids: list[int]) -> list[float]:
    answer = httpx.post(f"{server.url}/v1/embeddings",
                        json={"model": model, "input": [ids], "encoding_format": "float"})
    return answer.json()["data"][0]["embedding"]


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
def test_openai_client_decodes_the_float32_encoding(client, server, model):
    floats = _float_answer(server, model, SHORT)
    # Left unset, the client asks for base64 and decodes float32 itself.
    for endianness in ("native", "little"):
        got = client.embeddings.create(model=model, input=[SHORT], extra_body={
            "embed_dtype": "float32", "endianness": endianness})
        assert got.data[0].embedding == floats
    half = client.embeddings.create(model=model, input=[SHORT], encoding_format="base64",
                                    extra_body={"embed_dtype": "float16"})
    np.testing.assert_array_equal(decoded(base64.b64decode(half.data[0].embedding),
                                          "float16", "native"), rounded(floats, "float16"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("embed_dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("endianness", list(("native", "big", "little")))
def test_base64_carries_the_dtypes_rounding_in_its_byte_order(server, model, embed_dtype,
                                                              endianness):
    floats = _float_answer(server, model, SHORT)
    answer = httpx.post(f"{server.url}/v1/embeddings", json={
        "model": model, "input": [SHORT], "encoding_format": "base64",
        "embed_dtype": embed_dtype, "endianness": endianness})
    assert answer.status_code == 200, answer.text
    raw = base64.b64decode(answer.json()["data"][0]["embedding"])
    assert len(raw) == len(floats) * TORCH_DTYPES[embed_dtype].itemsize
    got = decoded(raw, embed_dtype, endianness)
    np.testing.assert_array_equal(got, rounded(floats, embed_dtype))
    rtol, atol = HALF_STEPS[embed_dtype]
    np.testing.assert_allclose(got, floats, rtol=rtol, atol=atol)


@pytest.mark.timeout(180)
def test_float_ignores_embed_dtype(server, model):
    floats = _float_answer(server, model, SHORT)
    answer = httpx.post(f"{server.url}/v1/embeddings", json={
        "model": model, "input": [SHORT], "encoding_format": "float",
        "embed_dtype": "fp8_e4m3", "endianness": "big"})
    assert answer.json()["data"][0]["embedding"] == floats


@pytest.mark.timeout(180)
def test_bytes_answer_is_the_vectors_with_metadata(server, model):
    floats = _float_answer(server, model, SHORT)
    answer = httpx.post(f"{server.url}/v1/embeddings", json={
        "model": model, "input": [SHORT], "encoding_format": "bytes",
        "embed_dtype": "bfloat16", "endianness": "big"})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/octet-stream"
    meta = json.loads(answer.headers["metadata"])
    assert meta["id"].startswith("embd-") and meta["model"] == model
    assert isinstance(meta["created"], int)
    assert meta["usage"] == {"prompt_tokens": len(SHORT), "total_tokens": len(SHORT)}
    assert meta["data"] == [{"index": 0, "embed_dtype": "bfloat16", "endianness": "big",
                             "start": 0, "end": 2 * len(floats), "shape": [len(floats)]}]
    assert len(answer.content) == 2 * len(floats)
    np.testing.assert_array_equal(decoded(answer.content, "bfloat16", "big"),
                                  rounded(floats, "bfloat16"))
    only = httpx.post(f"{server.url}/v1/embeddings", json={
        "model": model, "input": [SHORT], "encoding_format": "bytes_only",
        "embed_dtype": "fp8_e5m2"})
    assert only.status_code == 200 and "metadata" not in only.headers
    assert only.headers["content-type"] == "application/octet-stream"
    np.testing.assert_array_equal(decoded(only.content, "fp8_e5m2", "native"),
                                  rounded(floats, "fp8_e5m2"))


@pytest.mark.timeout(180)
def test_bytes_of_several_inputs_lie_end_to_end(server, model):
    answer = httpx.post(f"{server.url}/v1/embeddings", json={
        "model": model, "input": IDS, "encoding_format": "bytes", "embed_dtype": "float16",
        "endianness": "little"})
    meta = json.loads(answer.headers["metadata"])
    assert [item["index"] for item in meta["data"]] == [0, 1, 2]
    assert meta["usage"]["prompt_tokens"] == sum(map(len, IDS))
    assert meta["data"][-1]["end"] == len(answer.content)
    for item, ids in zip(meta["data"], IDS, strict=True):
        got = decoded(answer.content[item["start"]:item["end"]], "float16", "little")
        assert list(got.shape) == item["shape"]
        np.testing.assert_allclose(got, _reference(model, ids), rtol=2**-11, atol=1e-4)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("field, value, message", [
    ("embed_dtype", "float64",
     "Input should be 'float32', 'float16', 'bfloat16', 'fp8_e4m3' or 'fp8_e5m2'"),
    ("endianness", "middle", "Input should be 'native', 'big' or 'little'"),
    ("encoding_format", "hex", "Input should be 'float', 'base64', 'bytes' or 'bytes_only'"),
])
def test_bad_encoding_fields_are_400s(client, server, model, field, value, message):
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=model, input=[SHORT], extra_body={field: value})
    assert refused.value.body["param"] == field
    assert message in refused.value.body["message"]
    assert refused.value.body["type"] == "invalid_request_error"
    again = client.embeddings.create(model=model, input=[SHORT])
    assert again.data[0].embedding == _float_answer(server, model, SHORT)


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
