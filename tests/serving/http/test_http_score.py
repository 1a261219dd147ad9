"""POST /score (/v1/score) and /rerank (/v1/rerank, /v2/rerank) of
``tprun serve --runner pooling``, through httpx (the ``openai`` client has
no score or rerank call): each score equals the cosine similarity of
transformers' final-normed last-token hidden states of the same checkpoint;
rerank sorts by it and cuts to ``top_n``; bad bodies are OpenAI-shaped
errors after which the server goes on serving; a generating server answers
404 at every one of these routes, as at /v1/embeddings."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.hf_embeddings import hf_cosine_scorer, hf_last_token_embeddings
from tests.helpers.hf_models import save_embedding_llama
from tests.helpers.http_utils import metric, recording_app, serving_pooling_model

QUERY = "which text is nearest?"
DOCUMENTS = ["a first document", "the second one, somewhat longer than the first",
             "which text is nearest?", "x"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_embedding_llama(tmp_path_factory.mktemp("llama"), pad_token=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    with serving_pooling_model(tmp_path_factory.mktemp("score"), model,
                               "--runner", "pooling") as served:
        yield served


@pytest.fixture(scope="module")
def tokens(server, model):
    """Each text's tokens, as the server's /tokenize gives them."""
    def of(text: str) -> list[int]:
        return httpx.post(f"{server.url}/tokenize",
                          json={"model": model, "prompt": text}).json()["tokens"]
    return {text: of(text) for text in [QUERY, *DOCUMENTS, "q2", "d2"]}


@pytest.fixture(scope="module")
def reference(model, tokens):
    """The reference score of two texts: the cosine of their HF embeddings."""
    return hf_cosine_scorer(model, tokens)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_one_to_n_matches_transformers(server, model, tokens, reference, path):
    answer = _post(server, path, {"model": model, "text_1": QUERY, "text_2": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"].startswith("score-") and body["object"] == "list"
    assert body["model"] == model and isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == list(range(len(DOCUMENTS)))
    assert {d["object"] for d in body["data"]} == {"score"}
    assert [d["score"] for d in body["data"]] == pytest.approx(
        [reference(QUERY, d) for d in DOCUMENTS], abs=2e-5)
    assert body["data"][2]["score"] == pytest.approx(1.0, abs=1e-6)  # the query itself
    counted = sum(len(tokens[QUERY]) + 1 + len(tokens[d]) for d in DOCUMENTS)
    assert body["usage"] == {"prompt_tokens": counted, "total_tokens": counted,
                             "completion_tokens": 0}


@pytest.mark.timeout(240)
def test_score_n_to_n_and_its_other_field_names(server, model, reference):
    pairs = [("q2", DOCUMENTS[0]), ("d2", DOCUMENTS[1])]
    want = [reference(a, b) for a, b in pairs]
    firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
    for body in ({"text_1": firsts, "text_2": seconds},
                 {"queries": firsts, "documents": seconds},
                 {"queries": firsts, "items": seconds},
                 {"data_1": firsts, "data_2": seconds}):
        answer = _post(server, "/v1/score", body)
        assert answer.status_code == 200, answer.text
        assert [d["score"] for d in answer.json()["data"]] == pytest.approx(want, abs=2e-5)
    one = _post(server, "/score", {"text_1": "q2", "text_2": DOCUMENTS[0]}).json()
    assert [d["score"] for d in one["data"]] == pytest.approx(want[:1], abs=2e-5)


@pytest.mark.timeout(240)
def test_truncate_prompt_tokens_counts_the_kept_tokens(server, model, tokens):
    body = _post(server, "/score", {"text_1": DOCUMENTS[1], "text_2": DOCUMENTS[0],
                                    "truncate_prompt_tokens": 3}).json()
    assert body["usage"]["prompt_tokens"] == 3 + 1 + 3
    kept = [tokens[DOCUMENTS[1]][-3:], tokens[DOCUMENTS[0]][-3:]]
    x, y = hf_last_token_embeddings(model, kept)
    assert body["data"][0]["score"] == pytest.approx(float(x @ y), abs=2e-5)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_sorts_by_score_and_cuts_to_top_n(server, model, tokens, reference, path):
    want = [reference(QUERY, d) for d in DOCUMENTS]
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -want[i])
    answer = _post(server, path, {"model": model, "query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"].startswith("rerank-") and body["model"] == model
    assert [r["index"] for r in body["results"]] == order
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
        [want[i] for i in order], abs=2e-5)
    assert [r["document"] for r in body["results"]] == [{"text": DOCUMENTS[i]} for i in order]
    counted = sum(len(tokens[QUERY]) + 1 + len(tokens[d]) for d in DOCUMENTS)
    assert body["usage"]["total_tokens"] == counted
    top = _post(server, path, {"query": QUERY, "documents": DOCUMENTS, "top_n": 2}).json()
    assert [r["index"] for r in top["results"]] == order[:2]
    assert top["usage"]["total_tokens"] == counted  # every document was scored
    # vLLM's rule: a top_n of 0 or less (or past the end) returns every document.
    for top_n in (0, -1, 10):
        every = _post(server, path, {"query": QUERY, "documents": DOCUMENTS, "top_n": top_n})
        assert [r["index"] for r in every.json()["results"]] == order
    bare = _post(server, path, {"query": QUERY, "documents": DOCUMENTS,
                                "return_documents": False}).json()
    assert [r["index"] for r in bare["results"]] == order
    assert all("document" not in r for r in bare["results"])


def _error(answer: httpx.Response, status: int) -> dict:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.timeout(240)
def test_bad_bodies_are_openai_errors_and_the_server_goes_on(server, model, reference):
    mismatched = _error(_post(server, "/score", {"text_1": ["a", "b"],
                                                 "text_2": ["c", "d", "e"]}), 400)
    assert mismatched["message"] == "Input lengths must be either 1:1, 1:N or N:N"
    assert mismatched["type"] == "invalid_request_error"
    assert mismatched["param"] == "text_2"
    nothing = _error(_post(server, "/rerank", {"query": QUERY, "documents": []}), 400)
    assert nothing["message"] == "At least one text_pair element must be given"
    assert nothing["param"] == "documents"
    no_query = _error(_post(server, "/v1/score", {"queries": [], "documents": ["d"]}), 400)
    assert no_query["message"] == "At least one text element must be given"
    empty = _error(_post(server, "/v1/rerank", {"query": QUERY, "documents": ["a", ""]}), 400)
    assert empty["param"] == "documents" and "documents[1] is empty" in empty["message"]
    _error(_post(server, "/score", {"text_1": "a"}), 400)  # no second side
    _error(_post(server, "/score", {"text_1": "a", "text_2": "b", "queries": "c",
                                    "documents": "d"}), 400)  # two pairs of sides
    _error(_post(server, "/score", {"queries": "a", "documents": "b", "items": "c"}), 400)
    _error(_post(server, "/score", {"queries": "a", "text_2": "b"}), 400)  # of two pairs
    no_item = _error(_post(server, "/score", {"queries": "a", "items": []}), 400)
    assert no_item["param"] == "items"
    _error(_post(server, "/rerank", {"query": QUERY, "documents": "not a list"}), 400)
    _error(_post(server, "/v1/score", {"text_1": "a", "text_2": "b",
                                       "truncate_prompt_tokens": -2}), 400)
    too_long = _error(_post(server, "/v1/score", {"text_1": "a", "text_2": "b" * 80}), 400)
    assert too_long["code"] == "context_length_exceeded"
    _error(_post(server, "/v1/rerank", {"model": "another", "query": "a",
                                        "documents": ["b"]}), 404)
    not_json = httpx.post(f"{server.url}/score", content=b"text_1=a",
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert not_json.status_code == 415
    again = _post(server, "/score", {"text_1": "q2", "text_2": DOCUMENTS[0]})
    assert again.json()["data"][0]["score"] == pytest.approx(reference("q2", DOCUMENTS[0]),
                                                             abs=2e-5)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("field", ["priority", "truncate_prompt_tokens"])
def test_integers_past_int64_are_400s(server, reference, field):
    # A number no engine message can carry is the client's error, not a 500.
    huge = 2**70
    for path, body in (("/score", {"text_1": "q2", "text_2": DOCUMENTS[0]}),
                       ("/v2/rerank", {"query": "q2", "documents": [DOCUMENTS[0]]}),
                       ("/v1/embeddings", {"input": "q2"})):
        error = _error(_post(server, path, {**body, field: huge}), 400)
        assert error["type"] == "invalid_request_error"
    again = _post(server, "/score", {"text_1": "q2", "text_2": DOCUMENTS[0]})
    assert again.json()["data"][0]["score"] == pytest.approx(reference("q2", DOCUMENTS[0]),
                                                             abs=2e-5)


def _finished(server, reason: str) -> float:
    """``tprun:request_success_total`` for ``reason``, read from /metrics."""
    return metric(server.url, "tprun:request_success_total", {"finished_reason": reason})


@pytest.mark.timeout(240)
def test_each_embedded_text_counts_as_a_finished_request(server):
    # As /v1/embeddings counts: one finished "stop" request a text embedded.
    before = _finished(server, "stop")
    _post(server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[:2]})
    assert _finished(server, "stop") == before + 3
    _post(server, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS})
    assert _finished(server, "stop") == before + 3 + 1 + len(DOCUMENTS)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"])
def test_generating_server_does_not_serve_scores(tiny_dir, path):
    with recording_app(tiny_dir) as app:
        answer = app.http.post(path, json={"text_1": "a", "text_2": "b", "query": "a",
                                           "documents": ["b"]})
        assert answer.status_code == 404
        assert "error" in answer.json()
        assert not app.link.prompts  # nothing reached the engine


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["/v1/score", "/v1/rerank", "/v2/rerank"])
def test_api_key_guards_the_versioned_paths(tiny_dir, path):
    # vLLM's rule: --api-key guards /v1 and /v2 paths (not /score, /rerank).
    with recording_app(tiny_dir, pooling=True, api_keys=["the-key"]) as app:
        answer = app.http.post(path, json={"text_1": "a", "text_2": "b", "query": "a",
                                           "documents": ["b"]})
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "invalid_api_key"
        assert not app.link.prompts  # nothing reached the engine
