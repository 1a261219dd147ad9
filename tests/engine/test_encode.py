"""LLM.encode, vLLM's generic pooling call: on an embedding model its
"embed" outputs equal transformers' final-normed last-token hidden states
(normalized by hand, or raw with ``normalize`` off), on a classifier its
"classify" outputs equal transformers' logits through softmax; tasks the
engine does not serve are refused with vLLM's messages and the engine goes
on serving."""

import numpy as np
import pytest
import torch
import transformers  # the oracle: a test dependency, never skipped

from engine import LLM
from engine.pooling_outputs import PoolingRequestOutput
from engine.pooling_params import PoolingParams
from ipc.errors import InvalidRequestError
from tests.helpers.hf_embeddings import hf_last_token_embeddings

PROMPTS = [
    [5, 17, 99, 3],
    list(range(1, 40)),  # longer than the token budget of 16: chunked prefill
    [42],
]


def _llm(path: str, **kwargs) -> LLM:
    return LLM(model=path, device="cpu", block_size=16, max_num_seqs=8,
               max_num_batched_tokens=16, **kwargs)


def _hf_raw_last(path: str, ids: list[int]) -> np.ndarray:
    base = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return base(torch.tensor([ids])).last_hidden_state[0, -1].double().numpy()


@pytest.mark.timeout(180)
def test_embed_task_matches_transformers_and_embed(embedder):
    with _llm(embedder, runner="pooling") as llm:
        outs = llm.encode([{"prompt_token_ids": p} for p in PROMPTS], pooling_task="embed")
        embedded = llm.embed([{"prompt_token_ids": p} for p in PROMPTS])
        raw = llm.encode({"prompt_token_ids": PROMPTS[0]}, PoolingParams(normalize=False),
                         pooling_task="embed")
    assert all(isinstance(o, PoolingRequestOutput) and o.finished for o in outs)
    assert all(isinstance(e, PoolingRequestOutput) for e in embedded)  # vLLM's class tree
    assert [o.prompt_token_ids for o in outs] == PROMPTS
    assert len({o.request_id for o in outs}) == len(PROMPTS)
    for out, want, same in zip(outs, hf_last_token_embeddings(embedder, PROMPTS), embedded,
                               strict=True):
        data = out.outputs.data
        assert isinstance(data, torch.Tensor) and data.dtype == torch.float32
        assert data.shape == (64,)
        np.testing.assert_allclose(data.numpy(), want, atol=2e-5)
        np.testing.assert_allclose(data.numpy(), same.outputs.embedding, atol=1e-6)
    np.testing.assert_allclose(raw[0].outputs.data.numpy(), _hf_raw_last(embedder, PROMPTS[0]),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(180)
def test_classify_task_matches_transformers(classifier):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        classifier, dtype=torch.float32).eval()
    with _llm(classifier) as llm:
        outs = llm.encode([{"prompt_token_ids": p} for p in PROMPTS], pooling_task="classify")
        logits = llm.encode({"prompt_token_ids": PROMPTS[0]},
                            PoolingParams(use_activation=False), pooling_task="classify")
    for out, ids in zip(outs, PROMPTS, strict=True):
        with torch.no_grad():
            want = torch.softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()
        assert out.outputs.data.shape == (3,)
        np.testing.assert_allclose(out.outputs.data.numpy(), want, atol=2e-5)
    with torch.no_grad():
        raw = model(torch.tensor([PROMPTS[0]])).logits[0].double().numpy()
    np.testing.assert_allclose(logits[0].outputs.data.numpy(), raw, atol=2e-4)


@pytest.mark.timeout(180)
def test_tasks_the_engine_does_not_serve_are_refused(embedder, classifier):
    with _llm(embedder, runner="pooling") as llm:
        with pytest.raises(InvalidRequestError, match="pooling_task required for `LLM.encode`"):
            llm.encode("a text")
        with pytest.raises(InvalidRequestError,
                           match="Classification API is not supported by this model"):
            llm.encode("a text", pooling_task="classify")
        with pytest.raises(InvalidRequestError,
                           match="Classification API is not supported by this model"):
            llm.encode("a text", pooling_task="token_classify")
        with pytest.raises(InvalidRequestError, match=r"Unsupported task: 'score' Supported "
                                                      r"tasks: \('embed', 'token_embed'\)"):
            llm.encode("a text", pooling_task="score")
        with pytest.raises(InvalidRequestError, match="Task embed only supports"):
            llm.encode("a text", PoolingParams(use_activation=True), pooling_task="embed")
        again = llm.encode({"prompt_token_ids": PROMPTS[2]}, pooling_task="embed")
        np.testing.assert_allclose(again[0].outputs.data.numpy(),
                                   hf_last_token_embeddings(embedder, [PROMPTS[2]])[0],
                                   atol=2e-5)
    with _llm(classifier) as llm:
        with pytest.raises(InvalidRequestError,
                           match="Embedding API is not supported by this model"):
            llm.encode("a text", pooling_task="embed")
        with pytest.raises(InvalidRequestError,
                           match="Embedding API is not supported by this model"):
            llm.encode("a text", pooling_task="token_embed")
        with pytest.raises(InvalidRequestError, match=r"Unsupported task: 'plugin' Supported "
                                                      r"tasks: \('classify', 'token_classify'\)"):
            llm.encode("a text", pooling_task="plugin")
    with _llm(embedder) as llm:  # generating
        with pytest.raises(InvalidRequestError,
                           match=r"LLM.encode\(\) is only supported for pooling models"):
            llm.encode("a text", pooling_task="embed")


@pytest.mark.timeout(180)
def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(embedder):
    """vLLM's ``truncate_prompt_tokens`` keyword of ``LLM.encode``: each
    prompt keeps its last k tokens, and its output is transformers' of
    those tokens alone; a ``PoolingParams`` that sets its own keeps it."""
    with _llm(embedder, runner="pooling") as llm:
        outs = llm.encode([{"prompt_token_ids": p} for p in PROMPTS[:2]], pooling_task="embed",
                          truncate_prompt_tokens=3)
        own = llm.encode({"prompt_token_ids": PROMPTS[1]},
                         PoolingParams(truncate_prompt_tokens=5), pooling_task="embed",
                         truncate_prompt_tokens=3)
    kept = [p[-3:] for p in PROMPTS[:2]]
    assert [o.prompt_token_ids for o in outs] == kept
    for out, want in zip(outs, hf_last_token_embeddings(embedder, kept), strict=True):
        np.testing.assert_allclose(out.outputs.data.numpy(), want, atol=2e-5)
    assert own[0].prompt_token_ids == PROMPTS[1][-5:]
