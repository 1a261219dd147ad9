"""LLM(runner="pooling").embed: embeddings equal HF transformers' hidden
states of the same checkpoint, pooled and normalized by hand (on CUDA,
transformers' run on the GPU too)."""

import functools
import json

import numpy as np
import pytest
import torch
import transformers  # the oracle: a test dependency, never skipped

from engine import LLM
from engine.config import ConfigError
from engine.pooling_params import PoolingParams
from ipc.errors import InvalidRequestError
from tests.helpers.devices import DEVICES, NEEDS_CUDA
from tests.helpers.hf_models import POOLING_CHUNK, POOLING_PROMPTS, save_spread, small_llama

# Absolute tolerance of a normalized embedding (entries about 0.1) by
# device, float32 on both sides: on CUDA the Triton kernels and
# transformers' cuBLAS and SDPA kernels sum in different orders.
NORMALIZED_ATOL = {"cpu": 2e-5, "cuda": 1e-4}


@functools.cache
def _hf_hidden(path: str, device: str) -> list[np.ndarray]:
    """HF's final-normed hidden states of each prompt (``AutoModel``: the
    decoder without its LM head), float32 on ``device``."""
    base = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).to(device)
    base.eval()
    with torch.no_grad():
        hidden = [base(torch.tensor([p], device=device)).last_hidden_state[0].double().cpu()
                  .numpy() for p in POOLING_PROMPTS]
    del base
    return hidden


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A small random float32 Llama (GQA) and HF's hidden states on CPU."""
    model = small_llama(3, 256, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=64, rms_norm_eps=1e-6)
    path = save_spread(model, tmp_path_factory.mktemp("llama"))
    return path, _hf_hidden(path, "cpu")


def _normalized(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _embed(path, params=None, tp=1, device="cpu", **kwargs):
    with LLM(model=path, tensor_parallel_size=tp, device=device, runner="pooling",
             block_size=16, max_num_seqs=8, **kwargs) as llm:
        outs = llm.embed([{"prompt_token_ids": p} for p in POOLING_PROMPTS], params)
    assert [o.prompt_token_ids for o in outs] == POOLING_PROMPTS
    return [np.array(o.outputs.embedding) for o in outs]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tp, device", [(1, "cpu"), (2, "cpu"),
                                        pytest.param(1, "cuda", marks=NEEDS_CUDA)])
def test_last_token_pooling_matches_transformers(hf_dir, tp, device):
    # LAST (the default) over chunked prompts in one batch, L2-normalized.
    path, _ = hf_dir
    got = _embed(path, tp=tp, device=device, max_num_batched_tokens=POOLING_CHUNK)
    for vec, h in zip(got, _hf_hidden(path, device), strict=True):
        assert vec.shape == (64,)
        np.testing.assert_allclose(vec, _normalized(h[-1]), atol=NORMALIZED_ATOL[device])
        assert np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device", DEVICES)
def test_mean_and_cls_pooling_match_transformers(hf_dir, device):
    path, _ = hf_dir
    hidden = _hf_hidden(path, device)
    atol = NORMALIZED_ATOL[device]
    # The prompts (65 tokens) overfill one step's budget of 64: MEAN runs each
    # prompt whole, so the last waits for the next step rather than be chunked.
    got = _embed(path, device=device, pooler_config={"pooling_type": "MEAN"},
                 max_num_batched_tokens=64)
    for vec, h in zip(got, hidden, strict=True):
        np.testing.assert_allclose(vec, _normalized(h.mean(axis=0)), atol=atol)
    # Not normalized: entries of about 1, ten times the tolerance.
    got = _embed(path, PoolingParams(normalize=False), device=device,
                 pooler_config='{"pooling_type": "CLS"}')
    for vec, h in zip(got, hidden, strict=True):
        np.testing.assert_allclose(vec, h[0], atol=10 * atol)


def test_mean_pooling_refuses_a_budget_below_the_longest_prompt(hf_dir):
    path, _ = hf_dir
    with pytest.raises(ConfigError, match="MEAN pooling runs each prompt whole"):
        LLM(model=path, device="cpu", runner="pooling", max_num_batched_tokens=16,
            pooler_config={"pooling_type": "MEAN"})


@pytest.mark.timeout(180)
def test_normalize_off_and_matryoshka_dimensions(hf_dir, tmp_path):
    path, hidden = hf_dir
    got = _embed(path, PoolingParams(normalize=False), max_num_batched_tokens=POOLING_CHUNK)
    for vec, h in zip(got, hidden, strict=True):
        np.testing.assert_allclose(vec, h[-1], atol=2e-4)
    # A model that does not say it is a Matryoshka model refuses dimensions.
    with LLM(model=path, device="cpu", runner="pooling", max_num_seqs=4) as llm:
        with pytest.raises(InvalidRequestError, match="does not support matryoshka"):
            llm.embed("abc", PoolingParams(dimensions=8))
        with pytest.raises(InvalidRequestError, match="generation is not supported"):
            llm.generate("abc")
    # One that does: the first d values, then normalized.
    config = json.loads((path_obj := __import__("pathlib").Path(path) / "config.json").read_text())
    config["matryoshka_dimensions"] = [8, 32]
    path_obj.write_text(json.dumps(config))
    try:
        got = _embed(path, PoolingParams(dimensions=32), max_num_batched_tokens=POOLING_CHUNK)
        for vec, h in zip(got, hidden, strict=True):
            np.testing.assert_allclose(vec, _normalized(h[-1][:32]), atol=2e-5)
        with LLM(model=path, device="cpu", runner="pooling", max_num_seqs=4) as llm:
            with pytest.raises(InvalidRequestError, match=r"only supports \[8, 32\]"):
                llm.embed("abc", PoolingParams(dimensions=16))
    finally:
        del config["matryoshka_dimensions"]
        path_obj.write_text(json.dumps(config))


@pytest.mark.timeout(120)
def test_generating_model_refuses_embed_and_prompts_too_long(hf_dir):
    path, _ = hf_dir
    with LLM(model=path, device="cpu", max_num_seqs=4) as llm:
        with pytest.raises(InvalidRequestError, match="not supported by a generating model"):
            llm.embed("abc")
    with LLM(model=path, device="cpu", runner="pooling", max_num_seqs=4) as llm:
        with pytest.raises(InvalidRequestError, match="maximum context length is 64"):
            llm.embed({"prompt_token_ids": list(range(1, 66))})
        # A prompt of max_model_len tokens runs: no output token needs room.
        out, = llm.embed({"prompt_token_ids": list(range(1, 65))})
        assert len(out.outputs.embedding) == 64
        assert llm.engine.scheduler.kv.pool.num_free_blocks == llm.engine.num_blocks


@pytest.mark.timeout(120)
def test_last_pooling_takes_prefix_cache_hits(hf_dir):
    # LAST reads only the last token, so a prompt whose first blocks are
    # cached embeds the same from the hits; MEAN takes none (vLLM's rule).
    path, hidden = hf_dir
    prompt = {"prompt_token_ids": POOLING_PROMPTS[1]}
    with LLM(model=path, device="cpu", runner="pooling", block_size=16,
             max_num_batched_tokens=POOLING_CHUNK) as llm:
        first, = llm.embed(prompt)
        second, = llm.embed(prompt)
        assert llm.engine.scheduler.kv.prefix_hits == 32  # two full blocks of 39 tokens
    np.testing.assert_allclose(second.outputs.embedding, first.outputs.embedding, atol=1e-6)
    np.testing.assert_allclose(second.outputs.embedding, _normalized(hidden[1][-1]), atol=2e-5)
    with LLM(model=path, device="cpu", runner="pooling", block_size=16,
             pooler_config={"pooling_type": "MEAN"}) as llm:
        llm.embed(prompt)
        llm.embed(prompt)
        assert llm.engine.scheduler.kv.prefix_hits == 0
