"""vLLM's values of ``generation_config`` and ``kv_cache_dtype`` beyond
"auto": a folder holding a generation_config.json gives the sampling
defaults and its end-of-sequence ids; "vllm" drops the model's sampling
defaults but not its end-of-sequence ids; the name of the dtype the KV cache is kept in (the model's, after
``dtype``) is taken, any other name refused before any worker starts."""

from __future__ import annotations

import json
import shutil

import pytest

from checkpoint.description import describe
from checkpoint.tiny_model import ensure_tiny_model
from engine import LLM, SamplingParams
from engine.config import ConfigError, EngineConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return ensure_tiny_model(str(tmp_path_factory.mktemp("cache")))


def test_generation_config_folder_is_taken(tmp_path):
    (tmp_path / "generation_config.json").write_text("{}")
    assert EngineConfig(generation_config=str(tmp_path)).generation_config == str(tmp_path)
    for name in ("auto", "vllm"):
        assert EngineConfig(generation_config=name).generation_config == name


@pytest.mark.parametrize("where, match", [
    ("empty", r"^generation_config '.*empty': the folder holds no generation_config.json$"),
    ("missing", r"^generation_config must be 'auto', 'vllm' or a folder .* \(not a folder\)$"),
    ("file.json", r"^generation_config must be 'auto', 'vllm' or a folder .* \(not a folder\)$"),
])
def test_generation_config_that_is_no_folder_with_the_file_is_refused(
        tmp_path, no_workers, where, match):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.json").write_text("{}")
    with pytest.raises(ConfigError, match=match):
        LLM(model="tiny", device="cpu", generation_config=str(tmp_path / where))
    assert no_workers == []


@pytest.mark.timeout(120)
def test_llm_samples_with_the_folders_recommendation(tiny, tmp_path):
    """The folder's file, not the model's (tiny has none), gives the
    defaults: greedy, top_k 5 and 3 tokens at most."""
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "top_k": 5, "max_new_tokens": 3}))
    greedy3 = SamplingParams(temperature=0.0, top_k=5, max_tokens=3)
    with LLM(model=tiny, device="cpu", generation_config=str(tmp_path)) as llm:
        assert llm.get_default_sampling_params() == greedy3
        out = llm.generate("The quick brown fox")[0].outputs[0]
        assert out.token_ids == llm.generate("The quick brown fox", greedy3)[0].outputs[0].token_ids
        assert len(out.token_ids) <= 3


@pytest.mark.timeout(120)
def test_the_folders_eos_ids_end_outputs(tiny, tmp_path):
    """vLLM stops at the folder's eos_token_id too: the third token of a
    greedy answer made an end-of-sequence id ends the answer there, "stop";
    one outside the vocabulary is refused before any worker starts."""
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    with LLM(model=tiny, device="cpu") as llm:
        tokens = llm.generate("The quick brown fox", greedy)[0].outputs[0].token_ids
    stop_at = next(i for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [tokens[stop_at]]}))
    with LLM(model=tiny, device="cpu", generation_config=str(tmp_path)) as llm:
        out = llm.generate("The quick brown fox", greedy)[0].outputs[0]
        assert tokens[stop_at] in llm.engine.model_config.eos_token_ids
    assert (out.token_ids, out.finish_reason) == (tokens[:stop_at + 1], "stop")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 10**6}))
    with pytest.raises(ConfigError, match=r"eos_token_id \[1000000\] outside the vocabulary"):
        LLM(model=tiny, device="cpu", generation_config=str(tmp_path))


@pytest.mark.timeout(120)
def test_vllm_keeps_the_models_eos_ids_and_drops_its_sampling(tiny, tmp_path):
    """'vllm' drops the sampling defaults only: vLLM still reads the
    model's generation_config.json for its special tokens
    (``try_get_generation_config`` takes the model's file for "auto" and
    "vllm" alike), so an eos_token_id there ends outputs under either; the
    reference is the greedy answer without that file, cut after the id."""
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    with LLM(model=tiny, device="cpu") as llm:
        tokens = llm.generate("The quick brown fox", greedy)[0].outputs[0].token_ids
    stop_at = next(i for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])
    model = tmp_path / "tiny"
    shutil.copytree(tiny, model)
    (model / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [tokens[stop_at]], "temperature": 0.0, "max_new_tokens": 2}))
    with LLM(model=str(model), device="cpu", generation_config="vllm") as llm:
        assert llm.get_default_sampling_params() == SamplingParams()
        out = llm.generate("The quick brown fox", greedy)[0].outputs[0]
    assert (out.token_ids, out.finish_reason) == (tokens[:stop_at + 1], "stop")


def test_kv_cache_dtype_names_the_models_dtype(tiny):
    """tiny is float32: 'auto' only; in bfloat16 (--dtype), 'bfloat16' too."""
    model = describe(tiny)
    EngineConfig(model=tiny, dtype="bfloat16", kv_cache_dtype="bfloat16").check_model(model)
    EngineConfig(model=tiny, dtype="half", kv_cache_dtype="float16").check_model(model)
    EngineConfig(model=tiny, kv_cache_dtype="auto").check_model(model)
    with pytest.raises(ConfigError, match=r"^kv_cache_dtype 'bfloat16' is not supported: .* "
                       r"float32 here \(dtype\); only 'auto' is taken$"):
        EngineConfig(model=tiny, kv_cache_dtype="bfloat16").check_model(model)
    with pytest.raises(ConfigError, match=r"^kv_cache_dtype 'float16' is not supported: .* "
                       r"bfloat16 here \(dtype\); only 'auto' or 'bfloat16' is taken$"):
        EngineConfig(model=tiny, dtype="bfloat16", kv_cache_dtype="float16").check_model(model)


@pytest.mark.parametrize("name", ["float32", "fp8", "half", "fp8_e5m2"])
def test_kv_cache_dtype_names_vllm_does_not_have_or_tprun_does_not_keep(name):
    with pytest.raises(ConfigError, match=rf"^kv_cache_dtype '{name}' is not supported: .*"
                       r"only 'auto' or that dtype's name"):
        EngineConfig(kv_cache_dtype=name)


def test_kv_cache_dtype_is_checked_before_any_worker(tiny, no_workers):
    with pytest.raises(ConfigError, match="kv_cache_dtype 'bfloat16' is not supported"):
        LLM(model=tiny, device="cpu", kv_cache_dtype="bfloat16")
    assert no_workers == []
    with pytest.raises(AssertionError, match="an executor started"):  # every check passed
        LLM(model=tiny, device="cpu", dtype="bfloat16", kv_cache_dtype="bfloat16")
