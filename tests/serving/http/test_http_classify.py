"""POST /classify of ``tprun serve`` on a sequence classifier
(``LlamaForSequenceClassification``, no --runner needed): the probabilities
equal transformers' logits of the same checkpoint through softmax, the
labels its id2label names of the most probable class; refusals are
OpenAI-shaped 400s; the embedding and generation routes answer 404 on a
classifier's server, and /classify 404 on a generating or embedding one,
as vLLM registers each task's routes only."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
import transformers  # the oracle: a test dependency, never skipped

from checkpoint.tiny_model import CHAT_TEMPLATE
from tests.helpers.hf_models import save_classifier
from tests.helpers.http_utils import recording_app, serving_model

IDS = [[5, 17, 99, 3], list(range(1, 40)), [42]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A classifier of three labels whose tokenizer has a chat template
    (``tiny``'s: BOS first, each message "<|role|>\n" + text + EOS)."""
    path = save_classifier(tmp_path_factory.mktemp("cls"), num_labels=3)
    with open(f"{path}/tokenizer_config.json", "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}, f)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    with serving_model(tmp_path_factory.mktemp("classify"), model, "--nproc-per-node", "1",
                       "serve", "--model", model, "--device", "cpu",
                       "--max-num-batched-tokens", "16", "--block-size", "16",
                       "--disable-log-stats") as served:
        yield served


def _hf_probs(model: str, ids: list[int]) -> np.ndarray:
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        model, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].double().numpy()
    e = np.exp(logits - logits.max())
    return e / e.sum()


def _classify(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/classify", json=body, timeout=60)


@pytest.mark.timeout(180)
def test_probabilities_and_labels_match_transformers(server, model):
    answer = _classify(server, model=model, input=IDS)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"].startswith("classify-") and body["object"] == "list"
    assert body["model"] == model
    assert body["usage"] == {"prompt_tokens": sum(map(len, IDS)),
                             "total_tokens": sum(map(len, IDS)), "completion_tokens": 0}
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    for ids, item in zip(IDS, body["data"], strict=True):
        want = _hf_probs(model, ids)
        np.testing.assert_allclose(item["probs"], want, atol=2e-5)
        assert item["num_classes"] == 3
        assert item["label"] == f"label-{int(np.argmax(want))}"


@pytest.mark.timeout(180)
def test_text_input_and_activation_off(server, model):
    text = "a text of more than sixteen bytes to classify"
    ids = httpx.post(f"{server.url}/tokenize",
                     json={"model": model, "prompt": text}).json()["tokens"]
    one = _classify(server, model=model, input=text, priority=0).json()
    np.testing.assert_allclose(one["data"][0]["probs"], _hf_probs(model, ids), atol=2e-5)
    raw = _classify(server, model=model, input=[IDS[0]], use_activation=False).json()
    probs = np.array(raw["data"][0]["probs"])
    np.testing.assert_allclose(np.exp(probs) / np.exp(probs).sum(), _hf_probs(model, IDS[0]),
                               atol=2e-5)
    assert abs(probs.sum() - 1.0) > 1e-3  # logits, not probabilities


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a cat?"}]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("options", [{}, {"add_generation_prompt": True},
                                     {"add_special_tokens": True}])
def test_chat_messages_are_classified_as_transformers_renders_them(server, model, options):
    # vLLM's chat body: the template rendered over the messages, by default
    # without a generation prompt and without the tokenizer's own BOS.
    hf = transformers.AutoTokenizer.from_pretrained(model)
    text = hf.apply_chat_template(MESSAGES, tokenize=False,
                                  add_generation_prompt=options.get("add_generation_prompt",
                                                                    False))
    ids = hf(text, add_special_tokens=options.get("add_special_tokens", False))["input_ids"]
    answer = _classify(server, model=model, messages=MESSAGES, **options)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["usage"]["prompt_tokens"] == len(ids)
    (item,) = body["data"]
    want = _hf_probs(model, ids)
    np.testing.assert_allclose(item["probs"], want, atol=2e-5)
    assert item["index"] == 0 and item["label"] == f"label-{int(np.argmax(want))}"


@pytest.mark.timeout(180)
def test_chat_body_refusals_are_400s(server, model):
    for body, param in (({"input": "hi", "messages": MESSAGES}, None), ({}, None),
                        ({"messages": MESSAGES, "add_generation_prompt": True,
                          "continue_final_message": True}, None),
                        ({"messages": MESSAGES, "chat_template": "{{ messages }}"},
                         "chat_template")):
        answer = _classify(server, model=model, **body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"]["type"] == "invalid_request_error"
        if param is not None:
            assert answer.json()["error"]["param"] == param


@pytest.mark.timeout(180)
def test_refusals_are_400s_and_the_server_goes_on(server, model):
    for body, param in (({"input": ""}, "input"), ({"input": []}, "input"),
                        ({"input": [list(range(1, 70))]}, "input"),
                        ({"input": [[5, 400]]}, "input"),
                        ({"input": "hi", "truncate_prompt_tokens": 0}, None)):
        answer = _classify(server, model=model, **body)
        assert answer.status_code == 400, (body, answer.text)
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        if param is not None:
            assert error["param"] == param
    again = _classify(server, model=model, input=[IDS[0]]).json()
    np.testing.assert_allclose(again["data"][0]["probs"], _hf_probs(model, IDS[0]), atol=2e-5)


@pytest.mark.timeout(180)
def test_other_tasks_routes_are_not_served(server, model):
    for path, body in (("/v1/embeddings", {"input": "hi"}),
                       ("/v1/completions", {"prompt": "hi", "max_tokens": 2})):
        answer = httpx.post(f"{server.url}{path}", json={"model": model, **body})
        assert answer.status_code == 404, path
        assert "error" in answer.json()
    # Scores are a cross-encoder's, of one label: three labels score nothing.
    answer = httpx.post(f"{server.url}/score", json={"model": model, "text_1": "a",
                                                     "text_2": "b"})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "Score API is only enabled for num_labels == 1."


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    model = save_classifier(tmp_path_factory.mktemp("cross"), num_labels=1)
    with serving_model(tmp_path_factory.mktemp("cross-serve"), model, "--nproc-per-node", "1",
                       "serve", "--model", model, "--device", "cpu", "--block-size", "16",
                       "--disable-log-stats") as served:
        yield served


def _hf_pair_scores(model: str, pairs: list[tuple[str, str]], max_length: int | None = None,
                    activation=lambda x: 1 / (1 + np.exp(-x))) -> tuple[list[int], list[float]]:
    """transformers' pair encoding's token counts and the one logit through
    ``activation`` (the sigmoid unless given), pair by pair (cut to
    ``max_length`` by the tokenizer where given)."""
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=f"{model}/tokenizer.json")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        model, dtype=torch.float32).eval()
    counts, scores = [], []
    for a, b in pairs:
        cut = {} if max_length is None else {"truncation": True, "max_length": max_length}
        ids = tokenizer(text=a, text_pair=b, **cut)["input_ids"]
        with torch.no_grad():
            logit = hf(torch.tensor([ids])).logits[0, 0].item()
        counts.append(len(ids))
        scores.append(activation(logit))
    return counts, scores


@pytest.mark.timeout(180)
def test_cross_encoder_scores_and_reranks_pairs(cross_encoder):
    model = cross_encoder.model_dir
    query, documents = "what is a cat", ["the sky is blue today", "a cat is an animal"]
    counts, want = _hf_pair_scores(model, [(query, d) for d in documents])
    score = httpx.post(f"{cross_encoder.url}/score",
                       json={"model": model, "text_1": query, "text_2": documents}).json()
    np.testing.assert_allclose([d["score"] for d in score["data"]], want, atol=2e-5)
    assert score["usage"]["prompt_tokens"] == sum(counts)
    rerank = httpx.post(f"{cross_encoder.url}/rerank",
                        json={"model": model, "query": query, "documents": documents}).json()
    order = sorted(range(2), key=lambda i: want[i], reverse=True)
    assert [r["index"] for r in rerank["results"]] == order
    np.testing.assert_allclose([r["relevance_score"] for r in rerank["results"]],
                               [want[i] for i in order], atol=2e-5)
    probs = httpx.post(f"{cross_encoder.url}/classify",
                       json={"model": model, "input": "hi"}).json()["data"][0]
    assert probs["num_classes"] == 1 and probs["label"] == "label-0"


@pytest.mark.timeout(180)
def test_cross_encoder_scores_take_use_activation(cross_encoder):
    # vLLM's use_activation on /score and /rerank: false answers each
    # pair's raw logit, true (as left out) its sigmoid.
    model = cross_encoder.model_dir
    query, documents = "what is a cat", ["the sky is blue today", "a cat is an animal"]
    for use_activation, activation in ((False, lambda x: x),
                                       (True, lambda x: 1 / (1 + np.exp(-x)))):
        _, want = _hf_pair_scores(model, [(query, d) for d in documents], activation=activation)
        score = httpx.post(f"{cross_encoder.url}/score",
                           json={"model": model, "text_1": query, "text_2": documents,
                                 "use_activation": use_activation})
        assert score.status_code == 200, score.text
        np.testing.assert_allclose([d["score"] for d in score.json()["data"]], want,
                                   atol=2e-4)
        rerank = httpx.post(f"{cross_encoder.url}/rerank",
                            json={"model": model, "query": query, "documents": documents,
                                  "use_activation": use_activation})
        assert rerank.status_code == 200, rerank.text
        np.testing.assert_allclose(
            [r["relevance_score"]
             for r in sorted(rerank.json()["results"], key=lambda r: r["index"])],
            want, atol=2e-4)


@pytest.mark.timeout(180)
def test_cross_encoder_truncates_each_pair_as_the_tokenizer_does(cross_encoder):
    # The query stays whole; the long documents lose their ends.
    model = cross_encoder.model_dir
    query = "what is a cat"
    documents = ["a cat is a small animal that sleeps in the sun all day long",
                 "the sky is blue today and the clouds drift slowly to the east"]
    counts, want = _hf_pair_scores(model, [(query, d) for d in documents], max_length=24)
    assert counts == [24, 24]
    for path, body in (("/score", {"text_1": query, "text_2": documents}),
                       ("/rerank", {"query": query, "documents": documents})):
        answer = httpx.post(f"{cross_encoder.url}{path}",
                            json={"model": model, "truncate_prompt_tokens": 24, **body})
        assert answer.status_code == 200, answer.text
        got = answer.json()
        if path == "/score":
            scores = [d["score"] for d in got["data"]]
            assert got["usage"]["prompt_tokens"] == sum(counts)
        else:
            scores = [r["relevance_score"]
                      for r in sorted(got["results"], key=lambda r: r["index"])]
        np.testing.assert_allclose(scores, want, atol=2e-5)


@pytest.mark.timeout(180)
def test_cross_encoder_takes_its_sentence_transformers_activation(tmp_path):
    # config.json names Tanh (sentence-transformers' key): /score, /rerank
    # and /classify answer the logit's tanh.
    model = save_classifier(tmp_path / "model", num_labels=1, sentence_transformers={
        "activation_fn": "torch.nn.modules.activation.Tanh", "version": "4.1.0"})
    query, documents = "what is a cat", ["the sky is blue today", "a cat is an animal"]
    _, want = _hf_pair_scores(model, [(query, d) for d in documents], activation=np.tanh)
    with serving_model(tmp_path, model, "--nproc-per-node", "1", "serve",
                       "--model", model, "--device", "cpu", "--block-size", "16",
                       "--disable-log-stats") as served:
        score = httpx.post(f"{served.url}/score",
                           json={"model": model, "text_1": query, "text_2": documents}).json()
        rerank = httpx.post(f"{served.url}/rerank",
                            json={"model": model, "query": query, "documents": documents}).json()
        probs = httpx.post(f"{served.url}/classify",
                           json={"model": model, "input": [IDS[0]]}).json()["data"][0]["probs"]
    np.testing.assert_allclose([d["score"] for d in score["data"]], want, atol=2e-5)
    np.testing.assert_allclose(
        [r["relevance_score"] for r in sorted(rerank["results"], key=lambda r: r["index"])],
        want, atol=2e-5)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        model, dtype=torch.float32).eval()
    with torch.no_grad():
        logit = hf(torch.tensor([IDS[0]])).logits[0, 0].item()
    np.testing.assert_allclose(probs, [np.tanh(logit)], atol=2e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pooling", [False, True])
def test_generating_and_embedding_servers_do_not_classify(tiny_dir, pooling):
    with recording_app(tiny_dir, pooling=pooling) as app:
        answer = app.http.post("/classify", json={"input": "hi"})
        assert answer.status_code == 404
        assert "error" in answer.json()
