"""vLLM's token-level pooling tasks through ``LLM.encode``: "token_embed"
answers each prompt token's final-normed hidden state, L2-normalized
(transformers' per-token hidden states of the same checkpoint), and
"token_classify" each prompt token's logits through the classifier's
activation (transformers' per-token score logits through softmax); a
prompt longer than the token budget (chunked prefill) gets every row, a
batch that mixes "embed" and "token_embed" requests gives each its own
answer, and a prompt whose prefix is cached still gets every row, with no
cached tokens reported."""

import numpy as np
import pytest
import torch
import transformers  # the oracle: a test dependency, never skipped

from engine import LLM
from engine.pooling_params import PoolingParams
from ipc.errors import InvalidRequestError
from tests.helpers.devices import DEVICES
from tests.helpers.hf_embeddings import hf_last_token_embeddings, hf_token_hidden_states

BUDGET = 16
# A normalized row's tolerance by device (float32 both sides; CUDA's kernels
# sum in other orders than transformers' CPU ones).
NORMALIZED_ATOL = {"cpu": 2e-5, "cuda": 1e-4}
PROMPTS = [
    [5, 17, 99, 3],
    list(range(1, 40)),  # longer than the token budget: three chunks
    [42],
]


def _llm(path: str, device: str = "cpu", **kwargs) -> LLM:
    return LLM(model=path, device=device, block_size=16, max_num_seqs=8,
               max_num_batched_tokens=BUDGET, **kwargs)


def _normalized(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _prompts(prompts: list[list[int]]) -> list[dict]:
    return [{"prompt_token_ids": p} for p in prompts]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device", DEVICES)
def test_token_embed_rows_are_transformers_hidden_states_normalized(embedder, device):
    with _llm(embedder, device, runner="pooling") as llm:
        outs = llm.encode(_prompts(PROMPTS), pooling_task="token_embed")
        raw = llm.encode(_prompts(PROMPTS[1:2]), PoolingParams(normalize=False),
                         pooling_task="token_embed")
    assert [o.prompt_token_ids for o in outs] == PROMPTS
    for out, ids in zip(outs, PROMPTS, strict=True):
        data = out.outputs.data
        assert isinstance(data, torch.Tensor) and data.dtype == torch.float32
        assert data.shape == (len(ids), 64)
        np.testing.assert_allclose(data.numpy(), _normalized(hf_token_hidden_states(embedder, ids)),
                                   atol=NORMALIZED_ATOL[device])
    np.testing.assert_allclose(raw[0].outputs.data.numpy(),
                               hf_token_hidden_states(embedder, PROMPTS[1]), rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(180)
def test_token_classify_rows_are_transformers_token_logits_through_softmax(classifier):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        classifier, dtype=torch.float32).eval()
    with _llm(classifier) as llm:
        outs = llm.encode(_prompts(PROMPTS), pooling_task="token_classify")
        logits = llm.encode(_prompts(PROMPTS[1:2]), PoolingParams(use_activation=False),
                            pooling_task="token_classify")
        with pytest.raises(InvalidRequestError, match=r"Task token_classify only supports "
                                                      r"\['use_activation'\] parameters"):
            llm.encode("a text", PoolingParams(normalize=True), pooling_task="token_classify")
    for out, ids in zip(outs, PROMPTS, strict=True):
        with torch.no_grad():
            token_logits = model.score(model.model(torch.tensor([ids])).last_hidden_state[0])
        assert out.outputs.data.shape == (len(ids), 3)
        np.testing.assert_allclose(out.outputs.data.numpy(),
                                   torch.softmax(token_logits.double(), -1).numpy(), atol=2e-5)
        if ids == PROMPTS[1]:
            np.testing.assert_allclose(logits[0].outputs.data.numpy(),
                                       token_logits.double().numpy(), atol=2e-4)


@pytest.mark.timeout(180)
def test_chunked_prefill_gives_the_rows_of_a_whole_prompt(embedder):
    """The same prompt run in chunks of 16 and whole in one step: the same
    rows (the rows of each chunk joined in order)."""
    with _llm(embedder, runner="pooling") as chunked:
        parts = chunked.encode(_prompts(PROMPTS[1:2]), pooling_task="token_embed")
    with LLM(model=embedder, device="cpu", block_size=16, max_num_seqs=8,
             max_num_batched_tokens=64, runner="pooling") as whole:
        one = whole.encode(_prompts(PROMPTS[1:2]), pooling_task="token_embed")
    np.testing.assert_allclose(parts[0].outputs.data.numpy(), one[0].outputs.data.numpy(),
                               atol=1e-6)


@pytest.mark.timeout(180)
def test_a_batch_of_embed_and_token_embed_gives_each_its_answer(embedder):
    engine_prompts = [PROMPTS[0], [9, 8, 7, 6, 5], [42, 43], PROMPTS[1]]
    tasks = ["embed", "token_embed", "embed", "token_embed"]
    with _llm(embedder, runner="pooling") as llm:
        engine = llm.engine
        plans, schedule = [], engine.scheduler.schedule
        engine.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
        requests = [engine.new_pooling_request({"prompt_token_ids": p}, PoolingParams(),
                                               task=t)
                    for p, t in zip(engine_prompts, tasks)]
        for request in requests:
            engine.enqueue(request)
        pooled = {}
        while engine.has_unfinished_requests():
            pooled.update((d.req_id, d.pooled) for d in engine.step() if d.pooled is not None)
    # All four ran in the first step (the last its first chunk): one mixed batch.
    assert plans[0].scheduled_req_ids() == [r.req_id for r in requests]
    for request, ids, task in zip(requests, engine_prompts, tasks, strict=True):
        got = np.frombuffer(pooled[request.req_id], "<f4")
        if task == "embed":
            np.testing.assert_allclose(got, hf_last_token_embeddings(embedder, [ids])[0],
                                       atol=2e-5)
        else:
            np.testing.assert_allclose(got.reshape(len(ids), 64),
                                       _normalized(hf_token_hidden_states(embedder, ids)),
                                       atol=2e-5)


@pytest.mark.timeout(180)
def test_a_cached_prefix_still_gives_every_row(embedder):
    prompt = PROMPTS[1]
    with _llm(embedder, runner="pooling") as llm:
        llm.embed(_prompts([prompt]))
        hit = llm.embed(_prompts([prompt]))
        tokens = llm.encode(_prompts([prompt]), pooling_task="token_embed")
    assert hit[0].num_cached_tokens == 32  # the prefix cache holds its first two blocks
    assert tokens[0].num_cached_tokens == 0
    assert tokens[0].outputs.data.shape == (len(prompt), 64)
    np.testing.assert_allclose(tokens[0].outputs.data.numpy(),
                               _normalized(hf_token_hidden_states(embedder, prompt)), atol=2e-5)


@pytest.mark.timeout(180)
def test_rows_more_than_one_engine_message_carries_are_refused(embedder, monkeypatch):
    """A token-level request's rows travel whole in its last delta: 10 rows
    of 64 float32 values fit a bound of 2,560 bytes, 11 do not; an "embed"
    request of the same 11 tokens (one row) is not concerned."""
    from ipc import serde

    monkeypatch.setattr(serde, "MAX_POOLED_BYTES", 10 * 64 * 4)
    with _llm(embedder, runner="pooling") as llm:
        ten = llm.encode(_prompts([list(range(1, 11))]), pooling_task="token_embed")
        with pytest.raises(InvalidRequestError, match=r"token_embed answers a row of 64 float32 "
                                                      r"values a prompt token: 11 tokens make "
                                                      r"2816 bytes, more than the 2560"):
            llm.encode(_prompts([list(range(1, 12))]), pooling_task="token_embed")
        one = llm.embed(_prompts([list(range(1, 12))]))
    assert ten[0].outputs.data.shape == (10, 64)
    assert one[0].outputs.embedding is not None
