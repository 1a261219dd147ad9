"""LLM(runner="pooling").score: each pair's score equals the cosine
similarity of transformers' final-normed last-token hidden states of the
same checkpoint; vLLM's pairing rules (1 to 1, 1 to N, N to N) and the
tokens a score counts (first prompt, padding token, second prompt)."""

import json

import numpy as np
import pytest

from engine import LLM
from ipc.errors import InvalidRequestError
from tests.helpers.hf_embeddings import hf_last_token_embeddings
from tests.helpers.hf_models import save_spread, small_llama

QUERIES = [[5, 17, 99, 3], list(range(1, 40))]  # the second longer than a step's 16 tokens
DOCUMENTS = [[42, 7], [(7 * i) % 200 + 1 for i in range(21)]]
PAD = 258  # the byte tokenizer's "<pad>"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A small random Llama whose tokenizer_config.json names a padding
    token, and the reference embedding of each prompt by its ids."""
    hf = small_llama(7, 320, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=64, rms_norm_eps=1e-6)
    path = save_spread(hf, tmp_path_factory.mktemp("llama"))
    with open(f"{path}/tokenizer_config.json", "w") as f:
        json.dump({"pad_token": "<pad>"}, f)
    prompts = [*QUERIES, *DOCUMENTS, QUERIES[1][-5:]]
    return path, dict(zip(map(tuple, prompts), hf_last_token_embeddings(path, prompts)))


@pytest.fixture(scope="module")
def llm(model):
    with LLM(model=model[0], device="cpu", runner="pooling", block_size=16, max_num_seqs=8,
             max_num_batched_tokens=16) as llm:
        yield llm


def _ids(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


def _cosine(reference, a, b) -> float:
    x, y = reference[tuple(a)], reference[tuple(b)]
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


@pytest.mark.timeout(180)
def test_one_to_one_one_to_n_and_n_to_n_match_transformers(llm, model):
    _, reference = model
    one, = llm.score(_ids(QUERIES[:1])[0], _ids(DOCUMENTS[:1])[0])
    assert one.outputs.score == pytest.approx(_cosine(reference, QUERIES[0], DOCUMENTS[0]),
                                              abs=2e-5)
    assert one.prompt_token_ids == [*QUERIES[0], PAD, *DOCUMENTS[0]]
    assert one.finished
    one_to_n = llm.score(_ids(QUERIES[:1]), _ids(DOCUMENTS))
    assert [o.outputs.score for o in one_to_n] == pytest.approx(
        [_cosine(reference, QUERIES[0], d) for d in DOCUMENTS], abs=2e-5)
    assert [o.prompt_token_ids for o in one_to_n] == [[*QUERIES[0], PAD, *d] for d in DOCUMENTS]
    # The one query is embedded once: its request is the first of each pair's id.
    first_ids = {o.request_id.split("_")[0] for o in one_to_n}
    assert len(first_ids) == 1
    n_to_n = llm.score(_ids(QUERIES), _ids(DOCUMENTS))
    assert [o.outputs.score for o in n_to_n] == pytest.approx(
        [_cosine(reference, q, d) for q, d in zip(QUERIES, DOCUMENTS)], abs=2e-5)
    # A prompt scored against itself: cosine 1.
    same, = llm.score(_ids(QUERIES[1:]), _ids(QUERIES[1:]))
    assert same.outputs.score == pytest.approx(1.0, abs=1e-6)


@pytest.mark.timeout(180)
def test_truncate_prompt_tokens_scores_the_last_tokens(llm, model):
    _, reference = model
    out, = llm.score(_ids(QUERIES[1:]), _ids(DOCUMENTS[:1]), truncate_prompt_tokens=5)
    assert out.prompt_token_ids == [*QUERIES[1][-5:], PAD, *DOCUMENTS[0][-5:]]
    assert out.outputs.score == pytest.approx(
        _cosine(reference, QUERIES[1][-5:], DOCUMENTS[0]), abs=2e-5)


@pytest.mark.timeout(180)
def test_texts_score_as_their_tokens(llm, model):
    texts = ["a query", "a document of some length"]
    tokenized = [llm.engine.tokenizer.encode(t) for t in texts]
    by_ids, = llm.score(*_ids(tokenized))
    by_text, = llm.score(*texts)
    assert by_text.outputs.score == pytest.approx(by_ids.outputs.score, abs=1e-6)
    reference = dict(zip(map(tuple, tokenized), hf_last_token_embeddings(model[0], tokenized)))
    assert by_text.outputs.score == pytest.approx(_cosine(reference, *tokenized), abs=2e-5)


@pytest.mark.timeout(120)
def test_bad_pairings_are_refused_with_vllms_messages(llm):
    with pytest.raises(InvalidRequestError, match=r"must be either 1:1, 1:N or N:N"):
        llm.score(_ids(QUERIES), _ids([*DOCUMENTS, [9]]))
    with pytest.raises(InvalidRequestError, match="At least one text element must be given"):
        llm.score([], _ids(DOCUMENTS))
    with pytest.raises(InvalidRequestError, match="At least one text_pair element"):
        llm.score(_ids(QUERIES[:1]), [])
    with pytest.raises(InvalidRequestError, match="maximum context length is 64"):
        llm.score(_ids(QUERIES[:1]), _ids([list(range(1, 70))]))
    # Nothing of a refused call is left running.
    assert not llm.engine.has_unfinished_requests()
    again, = llm.score(_ids(QUERIES[:1]), _ids(QUERIES[:1]))
    assert again.outputs.score == pytest.approx(1.0, abs=1e-6)


@pytest.mark.timeout(120)
def test_generating_model_refuses_score(model):
    with LLM(model=model[0], device="cpu", max_num_seqs=4) as llm:
        with pytest.raises(InvalidRequestError, match=r"only supported for pooling models"):
            llm.score("a", "b")
