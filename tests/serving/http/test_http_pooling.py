"""POST /pooling (vLLM's generic pooling API) of ``tprun serve --runner
pooling`` and of a classifier's server, through httpx: the vectors equal
transformers' final-normed last-token hidden states of the same checkpoint
and /v1/embeddings' vectors, a classifier's outputs transformers'
probabilities; "token_embed" and "token_classify" answer one row a prompt
token (a list of lists; base64: the rows' float32 bytes one after the
other), transformers' per-token hidden states normalized or per-token
logits through softmax; a chat body pools the prompt transformers' chat template
renders; refusals are OpenAI-shaped 400s after which the server goes on
serving; vLLM's ``embed_dtype``, ``endianness`` and binary
``encoding_format``s carry /pooling's values as /v1/embeddings' (decoded
here from their bits); as vLLM's key check, /pooling (unversioned) is open where /v1 is
guarded; a generating server answers 404, as vLLM registers the pooling
routes only for a pooling model."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import torch
import transformers  # the oracle: a test dependency, never skipped

from tests.helpers.embed_dtypes import decoded, rounded
from tests.helpers.hf_embeddings import hf_last_token_embeddings, hf_token_hidden_states
from tests.helpers.hf_models import save_classifier, save_embedding_llama
from tests.helpers.http_utils import recording_app, serving_pooling_model

IDS = [[5, 17, 99, 3], list(range(1, 40)), [42]]
# Less than a block and a step: every request of it alone pools the same
# floats, to the bit.
SHORT = [5, 17, 99, 3, 8, 61, 7]
KEY = "pooling-test-key"
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if mood is defined %}({{ mood }}){% endif %}")
CHAT = [{"role": "system", "content": "embed this"},
        {"role": "user", "content": "a chat of more than sixteen bytes"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_embedding_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    with serving_pooling_model(tmp_path_factory.mktemp("pool"), model,
                               "--runner", "pooling",
                               "--chat-template", TEMPLATE, "--api-key", KEY) as served:
        yield served


def _post(server, path: str, key: str | None = KEY, **body) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)


def _data(answer: httpx.Response) -> list[np.ndarray]:
    assert answer.status_code == 200, answer.text
    return [np.array(d["data"]) for d in answer.json()["data"]]


@pytest.mark.timeout(180)
def test_pooled_vectors_match_transformers_and_embeddings(server, model):
    answer = _post(server, "/pooling", model=model, input=IDS)
    body = answer.json()
    assert body["id"].startswith("pool-") and body["object"] == "list"
    assert body["model"] == model and isinstance(body["created"], int)
    assert body["usage"] == {"prompt_tokens": sum(map(len, IDS)),
                             "total_tokens": sum(map(len, IDS)), "completion_tokens": 0}
    assert [(d["index"], d["object"]) for d in body["data"]] == [(i, "pooling")
                                                                 for i in range(len(IDS))]
    embedded = _post(server, "/v1/embeddings", model=model, input=IDS,
                     encoding_format="float").json()["data"]
    b64 = _post(server, "/pooling", model=model, input=IDS, task="embed",
                encoding_format="base64").json()["data"]
    for got, e, b, want in zip(_data(answer), embedded, b64,
                               hf_last_token_embeddings(model, IDS), strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5)
        # Other batches (prefix-cache hits, chunks) sum in other orders.
        np.testing.assert_allclose(got, e["embedding"], atol=1e-6)
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(b["data"]), "<f4"), got,
                                   atol=1e-6)


@pytest.mark.timeout(180)
def test_embed_dtypes_and_bytes_carry_the_float_values(server, model):
    (floats,) = _data(_post(server, "/pooling", input=[SHORT]))
    half = _post(server, "/pooling", input=[SHORT], encoding_format="base64",
                 embed_dtype="float16", endianness="big").json()["data"][0]["data"]
    np.testing.assert_array_equal(decoded(base64.b64decode(half), "float16", "big"),
                                  rounded(floats, "float16"))
    answer = _post(server, "/pooling", input=[SHORT], encoding_format="bytes",
                   embed_dtype="fp8_e4m3", endianness="little")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/octet-stream"
    meta = json.loads(answer.headers["metadata"])
    assert meta["id"].startswith("pool-") and meta["model"] == model
    assert meta["usage"] == {"prompt_tokens": len(SHORT), "total_tokens": len(SHORT)}
    assert meta["data"] == [{"index": 0, "embed_dtype": "fp8_e4m3", "endianness": "little",
                             "start": 0, "end": len(floats), "shape": [len(floats)]}]
    np.testing.assert_array_equal(decoded(answer.content, "fp8_e4m3", "little"),
                                  rounded(floats, "fp8_e4m3"))
    only = _post(server, "/pooling", input=[SHORT], encoding_format="bytes_only")
    assert "metadata" not in only.headers
    np.testing.assert_array_equal(decoded(only.content, "float32", "native"), floats)


@pytest.mark.timeout(180)
def test_token_embed_answers_a_row_a_prompt_token(server, model):
    answer = _post(server, "/pooling", model=model, input=IDS, task="token_embed")
    b64 = _post(server, "/pooling", model=model, input=IDS, task="token_embed",
                encoding_format="base64").json()["data"]
    (raw,) = _data(_post(server, "/pooling", input=[IDS[1]], task="token_embed",
                         normalize=False))
    assert answer.json()["usage"]["prompt_tokens"] == sum(map(len, IDS))
    for got, b, ids in zip(_data(answer), b64, IDS, strict=True):
        want = hf_token_hidden_states(model, ids)
        assert got.shape == (len(ids), 64)  # a list of lists, one a token
        np.testing.assert_allclose(got, want / np.linalg.norm(want, axis=1, keepdims=True),
                                   atol=2e-5)
        flat = np.frombuffer(base64.b64decode(b["data"]), "<f4")
        np.testing.assert_allclose(flat, got.ravel(), atol=1e-6)
    np.testing.assert_allclose(raw, hf_token_hidden_states(model, IDS[1]), rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(180)
def test_text_chat_and_normalize_off(server, model):
    text = "a text of more than sixteen bytes to pool"
    ids = httpx.post(f"{server.url}/tokenize", json={"model": model, "prompt": text}).json()
    (got,) = _data(_post(server, "/pooling", input=text, user="someone"))
    np.testing.assert_allclose(got, hf_last_token_embeddings(model, [ids["tokens"]])[0],
                               atol=2e-5)
    hf = transformers.AutoTokenizer.from_pretrained(model)
    chat_ids = list(hf.apply_chat_template(CHAT, chat_template=TEMPLATE, tokenize=True,
                                           add_generation_prompt=False, return_dict=False))
    answer = _post(server, "/pooling", model=model, messages=CHAT)
    (chat,) = _data(answer)
    assert answer.json()["usage"]["prompt_tokens"] == len(chat_ids)
    np.testing.assert_allclose(chat, hf_last_token_embeddings(model, [chat_ids])[0], atol=2e-5)
    (raw,) = _data(_post(server, "/pooling", input=[IDS[0]], normalize=False))
    base = transformers.AutoModel.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        want = base(torch.tensor([IDS[0]])).last_hidden_state[0, -1].double().numpy()
    np.testing.assert_allclose(raw, want, rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(180)
def test_chat_template_kwargs_are_the_templates_variables(server, model):
    brief = [{"role": "user", "content": "hi"}]
    hf = transformers.AutoTokenizer.from_pretrained(model)
    chat_ids = list(hf.apply_chat_template(brief, chat_template=TEMPLATE, tokenize=True,
                                           add_generation_prompt=False, return_dict=False,
                                           mood="calm"))
    answer = _post(server, "/pooling", model=model, messages=brief,
                   chat_template_kwargs={"mood": "calm"})
    (chat,) = _data(answer)
    assert answer.json()["usage"]["prompt_tokens"] == len(chat_ids)
    np.testing.assert_allclose(chat, hf_last_token_embeddings(model, [chat_ids])[0], atol=2e-5)
    # The key names a template, which this server does not take from a request.
    refused = _post(server, "/pooling", model=model, messages=brief,
                    chat_template_kwargs={"chat_template": TEMPLATE, "mood": "calm"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "chat_template_kwargs"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("body, param, message", [
    ({"input": [IDS[0]], "task": "classify"}, "task",
     "Classification API is not supported by this model"),
    ({"input": [IDS[0]], "task": "token_classify"}, "task",
     "Classification API is not supported by this model"),
    ({"input": [IDS[0]], "task": "score"}, "task",
     "Unsupported task: 'score' Supported tasks: ('embed', 'token_embed')"),
    ({"input": [IDS[0]], "task": "token_embed", "use_activation": True}, "use_activation",
     "Task token_embed only supports ['dimensions', 'normalize'] parameters"),
    ({"input": [IDS[0]], "dimensions": 8}, "dimensions", "dimensions is currently not supported"),
    ({"input": [IDS[0]], "use_activation": True}, "use_activation",
     "Task embed only supports ['dimensions', 'normalize'] parameters"),
    ({"input": ""}, "input", "the input is empty"),
    ({"input": [IDS[0]], "messages": CHAT}, "input", "give either input"),
    ({}, "input", "give either input"),
    ({"input": [list(range(1, 70))]}, "input", "maximum context length is 64"),
    ({"input": [IDS[0]], "embed_dtype": "int8"}, "embed_dtype",
     "Input should be 'float32', 'float16', 'bfloat16', 'fp8_e4m3' or 'fp8_e5m2'"),
    ({"input": [IDS[0]], "endianness": "BIG"}, "endianness",
     "Input should be 'native', 'big' or 'little'"),
    ({"input": [IDS[0]], "encoding_format": "binary"}, "encoding_format",
     "Input should be 'float', 'base64', 'bytes' or 'bytes_only'"),
])
def test_refusals_are_400s_and_the_server_goes_on(server, model, body, param, message):
    answer = _post(server, "/pooling", **body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert message in error["message"]
    (again,) = _data(_post(server, "/pooling", input=[IDS[2]]))
    np.testing.assert_allclose(again, hf_last_token_embeddings(model, [IDS[2]])[0], atol=2e-5)


@pytest.mark.timeout(180)
def test_pooling_is_open_where_v1_needs_the_key(server, model):
    # vLLM's key check guards /v1 paths only, as it does /classify and /score.
    assert _post(server, "/v1/embeddings", key=None, input=[IDS[0]]).status_code == 401
    assert _post(server, "/v1/embeddings", key="wrong", input=[IDS[0]]).status_code == 401
    (got,) = _data(_post(server, "/pooling", key=None, input=[IDS[0]]))
    np.testing.assert_allclose(got, hf_last_token_embeddings(model, [IDS[0]])[0], atol=2e-5)


@pytest.mark.timeout(180)
def test_classifier_pools_its_probabilities_and_generation_does_not_pool(tmp_path_factory,
                                                                        tiny_dir):
    path = save_classifier(tmp_path_factory.mktemp("cls"), num_labels=3)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32).eval()
    with serving_pooling_model(tmp_path_factory.mktemp("clsserve"), path) as served:
        got = _data(_post(served, "/pooling", key=None, input=IDS))
        classified = _post(served, "/classify", key=None, input=IDS).json()["data"]
        encoded = _post(served, "/pooling", key=None, input=IDS, encoding_format="bytes",
                        embed_dtype="bfloat16")
        tokens = _data(_post(served, "/pooling", key=None, input=IDS, task="token_classify"))
        refused = _post(served, "/pooling", key=None, input=[IDS[0]], task="embed")
    for probs, c, ids in zip(got, classified, IDS, strict=True):
        with torch.no_grad():
            want = torch.softmax(hf(torch.tensor([ids])).logits[0].double(), -1).numpy()
        np.testing.assert_allclose(probs, want, atol=2e-5)
        np.testing.assert_allclose(probs, c["probs"], atol=1e-6)
    items = json.loads(encoded.headers["metadata"])["data"]
    assert [(item["start"], item["end"], item["shape"]) for item in items] == [
        (0, 6, [3]), (6, 12, [3]), (12, 18, [3])]
    for item, probs in zip(items, got, strict=True):
        raw = encoded.content[item["start"]:item["end"]]
        np.testing.assert_allclose(decoded(raw, "bfloat16", "native"), probs, rtol=2**-8)
    for rows, ids in zip(tokens, IDS, strict=True):
        with torch.no_grad():
            hidden = hf.model(torch.tensor([ids])).last_hidden_state[0]
            want = torch.softmax(hf.score(hidden).double(), -1).numpy()
        assert rows.shape == (len(ids), 3)
        np.testing.assert_allclose(rows, want, atol=2e-5)
    assert refused.status_code == 400
    assert "Embedding API is not supported by this model" in refused.json()["error"]["message"]
    with recording_app(tiny_dir) as app:  # a generating model: no pooling route
        answer = app.http.post("/pooling", json={"input": "hi"})
        assert answer.status_code == 404 and "error" in answer.json()
