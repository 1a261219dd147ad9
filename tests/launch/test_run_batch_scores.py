"""``tprun run-batch`` with score and rerank lines (/score, /v1/score,
/rerank, /v1/rerank, /v2/rerank): on a pooling model each answer is the
route's, every score the cosine similarity of transformers' final-normed
last-token hidden states of the same checkpoint, rerank sorted by it and
cut to ``top_n``, mixed with /v1/embeddings lines; a body the route
refuses is its error body in that line and the batch goes on. On a
generating model of the same checkpoint a score, rerank or embeddings
line gets vLLM's "The model does not support ... API" line while a
completion line is answered."""

from __future__ import annotations

import numpy as np
import pytest
import transformers  # the tokenizer's oracle, as for the embeddings

from tests.helpers.batch_files import answer, assert_error_line, assert_refused, run_batch
from tests.helpers.hf_embeddings import hf_cosine_scorer, hf_last_token_embeddings
from tests.helpers.hf_models import save_embedding_llama

QUERY = "which text is nearest?"
DOCUMENTS = ["a first document", "the second one, somewhat longer than the first",
             "which text is nearest?", "x"]
QUERIES = ["q one", "query two"]
ITEMS = ["d one", "document two"]

# (custom_id, url, body), each body's model added
POOLING_LINES = [
    ("score", "/score", {"text_1": QUERY, "text_2": DOCUMENTS}),
    ("embed", "/v1/embeddings", {"input": QUERY}),
    ("score-v1", "/v1/score", {"queries": QUERIES, "documents": ITEMS}),
    ("rerank", "/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 2}),
    ("one-side", "/score", {"text_1": QUERY}),  # no second side: the route's 400
    ("rerank-v1", "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS,
                                 "return_documents": False}),
    ("empty-document", "/v2/rerank", {"query": QUERY, "documents": ["x", ""]}),
    ("rerank-v2", "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS[:3]}),
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("score-v2", "/v2/score", {"text_1": QUERY, "text_2": QUERY}),
    ("classify", "/classify", {"input": QUERY}),  # an embedding model does not classify
]
GENERATING_LINES = [
    ("score", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS}),
    ("rerank", "/rerank", {"query": QUERY, "documents": DOCUMENTS}),
    ("completion", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
    ("rerank-v2", "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS}),
    ("embed", "/v1/embeddings", {"input": QUERY}),
    ("classify", "/classify", {"input": QUERY}),
]
SUPPORTED = ("Supported endpoints: /v1/chat/completions, /v1/completions, /v1/embeddings, "
             "/score, /v1/score, /rerank, /v1/rerank, /v2/rerank, /classify.")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_embedding_llama(tmp_path_factory.mktemp("llama"), pad_token=True)


@pytest.fixture(scope="module")
def pooling(tmp_path_factory, model):
    """(the run's result, its output lines by custom_id)."""
    return run_batch(tmp_path_factory.mktemp("run-batch-scores"), model, POOLING_LINES,
                     "--runner", "pooling", "--max-num-batched-tokens", "16")


@pytest.fixture(scope="module")
def generating(tmp_path_factory, model):
    """(the run's result, its output lines by custom_id)."""
    return run_batch(tmp_path_factory.mktemp("run-batch-generating"), model, GENERATING_LINES,
                     "--max-num-batched-tokens", "16")


@pytest.fixture(scope="module")
def tokens(model):
    """Each text's tokens, by transformers' tokenizer of the checkpoint."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    return {t: tokenizer(t)["input_ids"] for t in {QUERY, *DOCUMENTS, *QUERIES, *ITEMS}}


@pytest.fixture(scope="module")
def reference(model, tokens):
    """The reference score of two texts: the cosine of their HF embeddings."""
    return hf_cosine_scorer(model, tokens)


def _pair_tokens(tokens, a: str, b: str) -> int:
    return len(tokens[a]) + 1 + len(tokens[b])  # the pad token between


@pytest.mark.timeout(300)
def test_score_lines_are_cosines_of_transformers_embeddings(pooling, model, tokens, reference):
    result, answers = pooling
    one_to_n = answer(answers["score"])
    assert one_to_n["object"] == "list" and one_to_n["model"] == model
    assert [d["index"] for d in one_to_n["data"]] == list(range(len(DOCUMENTS)))
    assert [d["score"] for d in one_to_n["data"]] == pytest.approx(
        [reference(QUERY, d) for d in DOCUMENTS], abs=2e-5)
    assert one_to_n["usage"]["prompt_tokens"] == sum(
        _pair_tokens(tokens, QUERY, d) for d in DOCUMENTS)
    n_to_n = answer(answers["score-v1"])
    assert [d["score"] for d in n_to_n["data"]] == pytest.approx(
        [reference(q, d) for q, d in zip(QUERIES, ITEMS)], abs=2e-5)
    embedding = answer(answers["embed"])["data"][0]["embedding"]
    want = hf_last_token_embeddings(model, [tokens[QUERY]])[0]
    np.testing.assert_allclose(embedding, want, atol=2e-5)


@pytest.mark.timeout(300)
def test_rerank_lines_sort_by_the_reference_scores(pooling, tokens, reference):
    _, answers = pooling
    for custom_id, documents, top_n in (("rerank", DOCUMENTS, 2), ("rerank-v1", DOCUMENTS, 0),
                                        ("rerank-v2", DOCUMENTS[:3], 0)):
        body = answer(answers[custom_id])
        want = sorted(range(len(documents)), key=lambda i: -reference(QUERY, documents[i]))
        want = want[:top_n] if top_n else want
        assert [r["index"] for r in body["results"]] == want
        assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
            [reference(QUERY, documents[i]) for i in want], abs=2e-5)
        shown = custom_id != "rerank-v1"  # return_documents false leaves them out
        assert all(("document" in r) == shown for r in body["results"])
        if shown:
            assert [r["document"]["text"] for r in body["results"]] == [
                documents[i] for i in want]
        assert body["usage"]["total_tokens"] == sum(
            _pair_tokens(tokens, QUERY, d) for d in documents)


@pytest.mark.timeout(300)
def test_failing_lines_get_their_error_and_the_batch_goes_on(pooling):
    result, answers = pooling
    assert result.returncode == 0, result.stderr
    assert_refused(answers["one-side"])
    assert_refused(answers["empty-document"], param="documents")
    assert_error_line(answers["chat"], "The model does not support Chat Completions API")
    assert_error_line(answers["classify"], "The model does not support Classification API")
    assert_error_line(answers["score-v2"], f"URL /v2/score was used. {SUPPORTED}")
    assert f"{len(POOLING_LINES)} lines written" in result.stderr
    assert "(6 answered with status 200)" in result.stderr


@pytest.mark.timeout(300)
def test_a_generating_model_answers_score_and_rerank_lines_with_vllms_error(generating):
    result, answers = generating
    assert result.returncode == 0, result.stderr
    for custom_id, api in (("score", "Scores"), ("rerank", "Rerank"), ("rerank-v2", "Rerank"),
                           ("embed", "Embeddings"), ("classify", "Classification")):
        assert_error_line(answers[custom_id], f"The model does not support {api} API")
    completion = answer(answers["completion"])
    assert completion["object"] == "text_completion"
    assert completion["usage"]["completion_tokens"] == 2
