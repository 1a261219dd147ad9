"""``POST /invocations``, vLLM's SageMaker route: a chat-shaped body is
answered as ``/v1/chat/completions`` answers it and a completion-shaped
one as ``/v1/completions`` (the same tokens at temperature 0, streaming
too), an embedding body on a pooling server as ``/v1/embeddings``; a body
of no served type is vLLM's 400 naming the types tried, in vLLM's order;
a body that is not JSON, or not sent as JSON, is refused as on every
JSON route. With load tracking on, an invocation counts while it runs."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers.hf_models import save_classifier, save_embedding_llama
from tests.helpers.http_utils import serving_pooling_model, serving_tiny

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 12, "temperature": 0.0, "logprobs": True, "ignore_eos": True}
COMPLETION = {"model": "tiny", "prompt": "The sky is", "max_tokens": 12, "temperature": 0.0,
              "logprobs": 1, "ignore_eos": True}
NO_HANDLER = "Cannot find suitable handler for request. Expected one of: "


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("invocations"), "--nproc-per-node", "1",
                      "serve", "--model", "tiny", "--device", "cpu", "--disable-log-stats",
                      "--enable-server-load-tracking") as served:
        yield served


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    model = save_classifier(tmp_path_factory.mktemp("cross"), num_labels=1)
    with serving_pooling_model(tmp_path_factory.mktemp("cross-serve"), model) as served:
        yield served


@pytest.fixture(scope="module")
def pooling_server(tmp_path_factory):
    model = save_embedding_llama(tmp_path_factory.mktemp("llama"))
    with serving_pooling_model(tmp_path_factory.mktemp("embed"), model,
                               "--runner", "pooling") as served:
        yield served


def _post(url: str, path: str, body) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def _counts(usage: dict) -> tuple:
    """The token counts of a usage (the second request of a prompt finds it
    in the prefix cache: its cached tokens differ)."""
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


def _chat_tokens(answer: dict) -> list[str]:
    return [t["token"] for t in answer["choices"][0]["logprobs"]["content"]]


@pytest.mark.timeout(240)
def test_chat_body_is_a_chat_completion(server):
    direct = _post(server.url, "/v1/chat/completions", CHAT)
    invoked = _post(server.url, "/invocations", CHAT)
    assert direct.status_code == invoked.status_code == 200
    direct, invoked = direct.json(), invoked.json()
    assert invoked["object"] == "chat.completion"
    assert _chat_tokens(invoked) == _chat_tokens(direct) and len(_chat_tokens(direct)) == 12
    assert invoked["choices"][0]["message"] == direct["choices"][0]["message"]
    assert _counts(invoked["usage"]) == _counts(direct["usage"])


@pytest.mark.timeout(240)
def test_completion_body_is_a_completion(server):
    direct = _post(server.url, "/v1/completions", COMPLETION).json()
    invoked = _post(server.url, "/invocations", COMPLETION).json()
    assert invoked["object"] == "text_completion"
    assert invoked["choices"][0]["logprobs"]["tokens"] == direct["choices"][0]["logprobs"]["tokens"]
    assert invoked["choices"][0]["text"] == direct["choices"][0]["text"]
    assert _counts(invoked["usage"]) == _counts(direct["usage"])
    assert direct["usage"]["completion_tokens"] == 12


@pytest.mark.timeout(240)
def test_streamed_invocation_streams(server):
    body = {**CHAT, "stream": True, "logprobs": False}
    with httpx.stream("POST", f"{server.url}/invocations", json=body, timeout=60) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    direct = _post(server.url, "/v1/chat/completions", {**CHAT, "logprobs": False}).json()
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in lines[:-1] if json.loads(line[6:])["choices"])
    assert text == direct["choices"][0]["message"]["content"]
    assert httpx.get(f"{server.url}/load", timeout=30).json() == {"server_load": 0}


def test_unknown_body_is_vllms_400(server):
    for body in ({"foo": 1}, {"model": "tiny", "input": "an embedding body"}, [1, 2]):
        answer = _post(server.url, "/invocations", body)
        assert answer.status_code == 400, body
        error = answer.json()["error"]
        assert error["message"] == NO_HANDLER + "['ChatCompletionRequest', 'CompletionRequest']"


def test_body_not_json_is_refused(server):
    broken = httpx.post(f"{server.url}/invocations", content=b"{not json",
                        headers={"content-type": "application/json"}, timeout=30)
    assert broken.status_code == 400
    assert "not valid JSON" in broken.json()["error"]["message"]
    as_text = httpx.post(f"{server.url}/invocations", content=b'{"prompt": "x"}',
                         headers={"content-type": "text/plain"}, timeout=30)
    assert as_text.status_code == 415


@pytest.mark.timeout(240)
def test_embedding_body_on_a_pooling_server(pooling_server):
    # Less than a block and a step: no prefix-cache hit and no chunk, so both
    # requests compute the same floats, to the bit.
    body = {"model": pooling_server.model_dir, "input": [[5, 17, 99, 3, 8, 61, 7]],
            "encoding_format": "float"}
    direct = _post(pooling_server.url, "/v1/embeddings", body)
    invoked = _post(pooling_server.url, "/invocations", body)
    assert direct.status_code == invoked.status_code == 200
    direct, invoked = direct.json(), invoked.json()
    assert [d["embedding"] for d in invoked["data"]] == [d["embedding"] for d in direct["data"]]
    assert _counts(invoked["usage"]) == _counts(direct["usage"])
    # Messages are a pooling request's other prompt form: /pooling answers
    # them (this model has no chat template: the same refusal).
    chat = {"model": pooling_server.model_dir, "messages": CHAT["messages"]}
    pooled, invoked = (_post(pooling_server.url, path, chat) for path in ("/pooling",
                                                                          "/invocations"))
    assert pooled.status_code == invoked.status_code
    assert invoked.json() == pooled.json()
    answer = _post(pooling_server.url, "/invocations", {"foo": 1})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == NO_HANDLER + (
        "['EmbeddingRequest', 'RerankRequest', 'ScoreRequest', 'PoolingRequest']")


def _approx(value):
    """``value`` with each float as ``pytest.approx`` of it: the second
    request of a prompt reads the first's prefix-cache blocks, so its
    floats may differ in their last bits."""
    if isinstance(value, dict):
        return {k: _approx(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_approx(v) for v in value]
    return pytest.approx(value, abs=1e-5) if isinstance(value, float) else value


def _without_ids(answer: dict) -> dict:
    """An answer less what differs between two requests (its id and time)."""
    return {k: v for k, v in answer.items() if k not in ("id", "created")}


@pytest.mark.timeout(240)
def test_rerank_and_score_bodies_on_a_classifier(cross_encoder):
    """A classifier's first type is classification, whose body needs
    ``input`` or ``messages`` (vLLM's two classification request types):
    a rerank or score body, which has neither, runs as rerank or score."""
    model = cross_encoder.model_dir
    bodies = {"/rerank": {"model": model, "query": "what is a cat",
                          "documents": ["the sky is blue", "a cat is an animal"]},
              "/score": {"model": model, "text_1": "what is a cat",
                         "text_2": ["the sky is blue", "a cat is an animal"]},
              "/classify": {"model": model, "input": ["what is a cat"]}}
    for path, body in bodies.items():
        direct = _post(cross_encoder.url, path, body)
        invoked = _post(cross_encoder.url, "/invocations", body)
        assert direct.status_code == invoked.status_code == 200, (path, invoked.text)
        assert _without_ids(invoked.json()) == _approx(_without_ids(direct.json())), path
