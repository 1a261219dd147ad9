"""``tprun run-batch --runner pooling``: /v1/embeddings lines answered with
OpenAI's embedding answer, each vector the one ``LLM.embed`` gives for the
same input (a text, texts, token ids, lists of token ids); a refused input
is the route's 400 error body; vLLM's ``embed_dtype`` and ``endianness``
are a line's as the route's, and a binary ``encoding_format`` ("bytes")
gets vLLM's stream-mode error line; generation lines get vLLM's "The model does
not support ... API" error line, an url of none of the batch APIs vLLM's
"Supported endpoints" line, while every other line is answered."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from engine import LLM
from tests.helpers.batch_files import answer, assert_error_line, assert_refused, run_batch
from tests.helpers.embed_dtypes import decoded
from tests.helpers.hf_models import save_embedding_llama

TEXT = "hello embeddings"
TEXTS = ["a first text", "a second, longer text of more than sixteen bytes"]
IDS = [5, 17, 99, 3]
ID_LISTS = [list(range(1, 40)), [42]]

# (custom_id, url, body)
LINES = [
    ("text", "/v1/embeddings", {"input": TEXT}),
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("texts", "/v1/embeddings", {"input": TEXTS, "encoding_format": "float"}),
    ("ids", "/v1/embeddings", {"input": IDS}),
    ("completion", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
    ("id-lists", "/v1/embeddings", {"input": ID_LISTS}),
    ("empty", "/v1/embeddings", {"input": ""}),
    ("audio", "/v1/audio/transcriptions", {"file": "x"}),
    ("half", "/v1/embeddings", {"input": [IDS], "encoding_format": "base64",
                                "embed_dtype": "float16", "endianness": "big"}),
    ("bytes", "/v1/embeddings", {"input": [IDS], "encoding_format": "bytes"}),
    ("bad-dtype", "/v1/embeddings", {"input": [IDS], "embed_dtype": "float64"}),
]
# The inputs each answered line embeds, in its answer's order.
INPUTS = {"text": [TEXT], "texts": TEXTS, "ids": [IDS], "id-lists": ID_LISTS}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_embedding_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def batch(tmp_path_factory, model):
    """(the run's result, its output lines by custom_id)."""
    return run_batch(tmp_path_factory.mktemp("run-batch-embed"), model, LINES,
                     "--runner", "pooling", "--max-num-batched-tokens", "16")


def _embed(model: str, prompts: list) -> list:
    """``LLM.embed``'s outputs of ``prompts`` (texts or token-id lists)."""
    with LLM(model=model, device="cpu", runner="pooling", block_size=16,
             max_num_batched_tokens=16) as llm:
        return llm.embed([p if isinstance(p, str) else {"prompt_token_ids": p}
                          for p in prompts])


@pytest.mark.timeout(300)
def test_embedding_lines_are_llm_embeds_vectors(batch, model):
    result, answers = batch
    assert result.returncode == 0, result.stderr
    flat = [p for inputs in INPUTS.values() for p in inputs]
    expected = iter(_embed(model, flat))
    for custom_id, inputs in INPUTS.items():
        body = answer(answers[custom_id])
        assert body["object"] == "list" and body["model"] == model
        assert [d["index"] for d in body["data"]] == list(range(len(inputs)))
        tokens = 0
        for d in body["data"]:
            want = next(expected)
            assert d["object"] == "embedding"
            np.testing.assert_allclose(d["embedding"], want.outputs.embedding, atol=1e-5)
            tokens += len(want.prompt_token_ids)
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == tokens


@pytest.mark.timeout(300)
def test_generation_lines_get_vllms_error_and_the_rest_are_answered(batch):
    result, answers = batch
    assert_error_line(answers["chat"], "The model does not support Chat Completions API")
    assert_error_line(answers["completion"], "The model does not support Completions API")
    assert_refused(answers["empty"], param="input")
    assert_error_line(answers["audio"], (
        "URL /v1/audio/transcriptions was used. Supported endpoints: /v1/chat/completions, "
        "/v1/completions, /v1/embeddings, /score, /v1/score, /rerank, /v1/rerank, "
        "/v2/rerank, /classify."))
    assert "11 lines written" in result.stderr
    assert "(5 answered with status 200)" in result.stderr


@pytest.mark.timeout(300)
def test_encoding_fields_are_the_routes(batch, model):
    _, answers = batch
    (item,) = answer(answers["half"])["data"]
    (want,) = _embed(model, [IDS])
    np.testing.assert_allclose(decoded(base64.b64decode(item["embedding"]), "float16", "big"),
                               want.outputs.embedding, rtol=2**-11, atol=1e-5)
    assert_error_line(answers["bytes"], "Request must not be sent in stream mode")
    assert_refused(answers["bad-dtype"], param="embed_dtype")
