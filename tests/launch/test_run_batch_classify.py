"""``tprun run-batch`` on a sequence classifier: /classify lines answered
with the route's answer, each probability transformers' logits of the same
checkpoint through softmax and each label its id2label name of the most
probable class; a body the route refuses, or a score line on a classifier
of more than one label, is the route's 400 error body; an embeddings or a
chat line gets vLLM's "The model does not support ... API" line, and
/v1/classify (a path vLLM does not serve) vLLM's "Supported endpoints"
line, while every other line is answered. On a cross-encoder (one label)
score and rerank lines are the routes' answers, ``use_activation`` false
giving transformers' raw logit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers  # the oracle: a test dependency, never skipped

from tests.helpers.batch_files import answer, assert_error_line, assert_refused, run_batch
from tests.helpers.hf_models import save_classifier

TEXT = "a text to classify"
IDS = [[5, 17, 99, 3], list(range(1, 40))]

# (custom_id, url, body)
LINES = [
    ("text", "/classify", {"input": TEXT}),
    ("embed", "/v1/embeddings", {"input": TEXT}),
    ("ids", "/classify", {"input": IDS}),
    ("score", "/score", {"text_1": "a", "text_2": "b"}),
    ("empty", "/classify", {"input": ""}),
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("v1", "/v1/classify", {"input": TEXT}),
    ("raw", "/classify", {"input": [IDS[0]], "use_activation": False}),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("cls"), num_labels=3)


@pytest.fixture(scope="module")
def batch(tmp_path_factory, model):
    """(the run's result, its output lines by custom_id)."""
    return run_batch(tmp_path_factory.mktemp("run-batch-classify"), model, LINES,
                     "--max-num-batched-tokens", "16")


def _hf_logits(model: str, ids: list[int]) -> np.ndarray:
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        model, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].double().numpy()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.timeout(300)
def test_classify_lines_match_transformers(batch, model):
    _, answers = batch
    text_ids = transformers.PreTrainedTokenizerFast(
        tokenizer_file=f"{model}/tokenizer.json")(TEXT)["input_ids"]
    for custom_id, inputs in (("text", [text_ids]), ("ids", IDS)):
        body = answer(answers[custom_id])
        assert body["object"] == "list" and body["model"] == model
        assert body["id"].startswith("classify-")
        assert body["usage"]["prompt_tokens"] == sum(map(len, inputs))
        assert [d["index"] for d in body["data"]] == list(range(len(inputs)))
        for ids, item in zip(inputs, body["data"], strict=True):
            want = _softmax(_hf_logits(model, ids))
            np.testing.assert_allclose(item["probs"], want, atol=2e-5)
            assert item["num_classes"] == 3
            assert item["label"] == f"label-{int(np.argmax(want))}"
    raw = answer(answers["raw"])["data"][0]["probs"]
    np.testing.assert_allclose(raw, _hf_logits(model, IDS[0]), atol=2e-4)


@pytest.mark.timeout(300)
def test_lines_a_classifier_does_not_answer_get_their_error(batch):
    result, answers = batch
    assert result.returncode == 0, result.stderr
    assert_refused(answers["empty"], param="input")
    assert_refused(answers["score"])
    assert answers["score"]["error"]["error"]["message"] == (
        "Score API is only enabled for num_labels == 1.")
    assert_error_line(answers["embed"], "The model does not support Embeddings API")
    assert_error_line(answers["chat"], "The model does not support Chat Completions API")
    assert_error_line(answers["v1"])
    assert answers["v1"]["error"].startswith("URL /v1/classify was used. Supported endpoints: ")
    assert f"{len(LINES)} lines written" in result.stderr
    assert "(3 answered with status 200)" in result.stderr


@pytest.mark.timeout(300)
def test_cross_encoder_lines_take_use_activation(tmp_path):
    model = save_classifier(tmp_path / "model", num_labels=1)
    query, documents = "what is a cat", ["the sky is blue today", "a cat is an animal"]
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=f"{model}/tokenizer.json")
    logits = np.array([_hf_logits(model, tokenizer(text=query, text_pair=d)["input_ids"])[0]
                       for d in documents])
    lines = [("raw", "/v1/score", {"text_1": query, "text_2": documents, "use_activation": False}),
             ("sigmoid", "/score", {"text_1": query, "text_2": documents}),
             ("rerank", "/v2/rerank", {"query": query, "documents": documents,
                                       "use_activation": False})]
    result, answers = run_batch(tmp_path, model, lines)
    assert result.returncode == 0, result.stderr
    raw = [d["score"] for d in answer(answers["raw"])["data"]]
    np.testing.assert_allclose(raw, logits, atol=2e-4)
    sigmoid = [d["score"] for d in answer(answers["sigmoid"])["data"]]
    np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp(-logits)), atol=2e-5)
    results = sorted(answer(answers["rerank"])["results"], key=lambda r: r["index"])
    np.testing.assert_allclose([r["relevance_score"] for r in results], logits, atol=2e-4)
