"""``EngineConfig`` owns every rule: bad settings fail before any worker starts.

Each case is checked where a user meets it: ``LLM(...)`` raises
``ValueError`` (``ConfigError``) without spawning a worker, and the CLI
prints one ``tprun: error:`` line and exits with code 2, leaving nothing.
The projections the runner and scheduler receive are built by the config
and cross the socket typed.
"""

from __future__ import annotations

import json
import os

import pytest

from engine import LLM, SamplingParams
from engine.config import ConfigError, EngineConfig
from ipc.config import LoRAConfig, RunnerConfig
from ipc.endpoints import IPC_PATH_MAX
from ipc.messages import ControlCall
from ipc.serde import decode_broadcast, encode
from launch.cli import _engine_config, build_parser
from tests.helpers.checkpoints import runner_config
from tests.helpers.proc_utils import long_directory, run_tprun


def _model_dir(tmp_path, **overrides) -> str:
    """A config.json-only model directory (what the checks read)."""
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 576,
              "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
              "num_hidden_layers": 2, "max_position_embeddings": 2048}
    config.update(overrides)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_size=12), "block_size must be a power of two"),
    (dict(block_size=0), "block_size must be an int >= 1"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=2.5), "max_num_batched_tokens"),
    (dict(max_model_len=1), r"max_model_len must be an int >= 2 .* or -1 \(auto: the longest "
                            r"the KV cache holds\), got 1$"),
    (dict(max_model_len=0), r"max_model_len must be an int >= 2 .*, got 0$"),
    (dict(max_model_len=-2), r"max_model_len must be an int >= 2 .*, got -2$"),
    (dict(max_model_len="auto"), r"max_model_len must be an int >= 2 .*, got 'auto'$"),
    (dict(max_model_len=True), r"max_model_len must be an int >= 2 .*, got True$"),
    (dict(dtype="int8"), "dtype must be one of"),
    (dict(device="tpu"), "device must be one of"),
    (dict(scheduling_policy="lifo"), "scheduling_policy must be one of"),
    (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
    (dict(executor="uni", tensor_parallel_size=2), "TP=1 only"),
    (dict(master_port=70000), "master_port"),
    (dict(enable_prefix_caching="yes"), "enable_prefix_caching must be a bool"),
    (dict(max_logprobs=-2), "max_logprobs must be an int >= -1"),
    (dict(max_cudagraph_capture_size=0), "max_cudagraph_capture_size must be an int >= 1"),
    (dict(seed=-1), r"seed must be an int in \[0, 2\*\*63\)"),
    (dict(seed=1 << 64), r"seed must be an int in \[0, 2\*\*63\)"),
    (dict(device="cpu", attention_backend="flash_attn"), "'flash_attn' runs on CUDA only"),
    (dict(device="cpu", executor="mp", master_addr="999.1.1.1"),
     "master_addr '999.1.1.1' does not resolve"),
    # TEST-NET-1 (RFC 5737): the store the ranks meet at would wait minutes to reach it.
    (dict(device="cpu", tensor_parallel_size=2, master_addr="192.0.2.1"),
     "master_addr '192.0.2.1' is not an address of this machine"),
    # Every count crosses a socket as a 64-bit int: a larger one is the user's error.
    (dict(kv_cache_memory_bytes=1 << 64),
     r"kv_cache_memory_bytes must be an int >= 1 \(below 2\*\*63\), got 18446744073709551616"),
    (dict(max_num_seqs=1 << 63), r"max_num_seqs must be an int >= 1 \(below 2\*\*63\)"),
    (dict(max_model_len=1 << 63), r"max_model_len must be an int >= 2 .*, got 9223372036854775808$"),
    (dict(max_logprobs=1 << 63), "max_logprobs must be an int >= -1"),
    (dict(gpu_memory_utilization="0.5"), "gpu_memory_utilization must be a number, got '0.5'"),
    (dict(step_timeout_s=None), "step_timeout_s must be a number, got None"),
    # vLLM's ranks only (its LoRAConfig's), whether LoRA is on or not, as its CLI.
    (dict(enable_lora=True, max_lora_rank=4),
     r"max_lora_rank must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512, got 4$"),
    (dict(max_lora_rank=1024), r"max_lora_rank must be one of .*, got 1024$"),
    (dict(enable_lora=True, max_lora_rank=True), r"max_lora_rank must be an int >= 1"),
])
def test_bad_arguments_raise_from_llm_before_any_worker(no_workers, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(model="tiny", **kwargs)
    assert no_workers == []


@pytest.mark.parametrize("rank", [1, 8, 16, 32, 64, 128, 256, 320, 512])
def test_every_vllm_lora_rank_is_taken(rank):
    assert EngineConfig(model="tiny", enable_lora=True, max_lora_rank=rank).lora_config == (
        LoRAConfig(max_loras=1, max_lora_rank=rank))


def test_a_busy_master_port_is_refused_before_any_worker(no_workers):
    """The executor serves the ranks' store there: a busy port would fail
    its listen with a traceback."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"master_port {port}: cannot listen on "
                                              f"127.0.0.1:{port}"):
            LLM(model="tiny", device="cpu", tensor_parallel_size=2, master_port=port)
    assert no_workers == []


@pytest.mark.parametrize("model", [None, 3, ""])
def test_a_model_that_is_not_a_name_is_refused(no_workers, model):
    with pytest.raises(ConfigError, match=f"model must name 'tiny', .*, got {model!r}$"):
        LLM(model=model)
    assert no_workers == []


def _damaged_copy(source: str, target, damage) -> str:
    """A copy of the model directory ``source`` at ``target``, then ``damage(target)``."""
    import shutil

    shutil.copytree(source, target)
    damage(target)
    return str(target)


def _cut(path, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


def _sharded_index(directory) -> None:
    (directory / "model.safetensors").rename(directory / "part-1.safetensors")
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}}))


def _edit_config(directory, **fields) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **fields}))


@pytest.mark.parametrize("damage, match", [
    (lambda d: (d / "model.safetensors").unlink(), "no safetensors checkpoint in"),
    (lambda d: _edit_config(d, num_key_value_heads=1),
     r"model/model.safetensors: tensor model.layers.0.self_attn.k_proj.weight has shape "
     r"\[32, 64\], but .*model/config.json implies \[16, 64\] \(num_key_value_heads \* "
     r"head_dim, hidden_size\)"),
    (lambda d: _edit_config(d, vocab_size=300),
     r"model.safetensors: tensor model.embed_tokens.weight has shape \[320, 64\], but "
     r".*config.json implies \[300, 64\] \(vocab_size, hidden_size\)"),
    (lambda d: _cut(d / "model.safetensors", 1000),
     r"model.safetensors is not a readable safetensors file: .*header"),
    (lambda d: _cut(d / "model.safetensors", 900_000),
     r"model.safetensors is not a readable safetensors file: .*not fully covered"),
    (_sharded_index, r"part-2.safetensors is missing \(model.safetensors.index.json names it\)"),
    (lambda d: (d / "model.safetensors.index.json").write_text("[]"),
     "cannot read .*model.safetensors.index.json: no weight_map"),
    (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer.json in"),
    (lambda d: (d / "tokenizer.json").write_text("{garbage"), "cannot read .*tokenizer.json: "),
])
def test_model_files_that_cannot_load_are_refused_before_any_worker(no_workers, tiny_dir,
                                                                    tmp_path, damage, match):
    """What every rank would fail on while loading (a traceback a rank) is
    the model the user named: one ConfigError first, headers read only."""
    model = _damaged_copy(tiny_dir, tmp_path / "model", damage)
    with pytest.raises(ConfigError, match=match):
        LLM(model=model, tensor_parallel_size=2, device="cpu")
    assert no_workers == []


def test_a_draft_model_whose_config_disagrees_is_refused_before_any_worker(no_workers,
                                                                          tiny_dir, tmp_path):
    draft = _damaged_copy(tiny_dir, tmp_path / "draft",
                          lambda d: _edit_config(d, intermediate_size=128))
    with pytest.raises(ConfigError, match=r"speculative_config: draft model: .*draft/"
                                          r"model.safetensors: tensor model.layers.0.mlp."
                                          r"gate_proj.weight has shape \[192, 64\]"):
        LLM(model=tiny_dir, tensor_parallel_size=2, device="cpu", speculative_config={
            "method": "draft_model", "model": draft, "num_speculative_tokens": 2})
    assert no_workers == []


def test_a_draft_model_without_weights_is_refused_before_any_worker(no_workers, tiny_dir,
                                                                    tmp_path):
    draft = _damaged_copy(tiny_dir, tmp_path / "draft",
                          lambda d: (d / "model.safetensors").unlink())
    with pytest.raises(ConfigError, match="speculative_config: draft model: no safetensors "
                                          "checkpoint in"):
        LLM(model=tiny_dir, tensor_parallel_size=2, device="cpu", speculative_config={
            "method": "draft_model", "model": draft, "num_speculative_tokens": 2})
    assert no_workers == []


def test_attach_workers_dir_must_be_private_before_any_worker(no_workers, tmp_path):
    """Whoever can enter the directory can reach its sockets: a directory
    others may enter, and a file, are refused before the model loads; a
    missing one passes (the executor makes it, mode 0700), as does 0700."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    shared.chmod(0o750)
    (tmp_path / "file").write_text("")
    for path, match in [(shared, f"attach_workers_dir {shared} must be private to its owner "
                                 r"\(mode 750; chmod 700"),
                        (tmp_path / "file", "is not a directory")]:
        with pytest.raises(ConfigError, match=match):
            LLM(model="tiny", device="cpu", tensor_parallel_size=2, attach_workers_dir=str(path))
    assert no_workers == []
    shared.chmod(0o700)
    for path in (shared, tmp_path / "missing"):
        EngineConfig(model="tiny", device="cpu", tensor_parallel_size=2, executor="mp",
                     attach_workers_dir=str(path)).check_machine()
    assert not (tmp_path / "missing").exists()
    too_long = long_directory(tmp_path, IPC_PATH_MAX - len("/broadcast") + 1)
    with pytest.raises(ConfigError, match=rf"attach_workers_dir: the socket path {too_long}/broadcast "
                                          rf"is {IPC_PATH_MAX + 1} bytes"):
        LLM(model="tiny", device="cpu", tensor_parallel_size=2, attach_workers_dir=str(too_long))
    assert no_workers == [] and not os.path.exists(too_long)


@pytest.mark.parametrize("overrides, tp, match", [
    ({}, 2, "9 attention heads, which do not divide by the tensor-parallel size 2"),
    ({"num_attention_heads": 6, "num_key_value_heads": 3}, 2, "3 KV heads"),
    ({"architectures": ["GPT2LMHeadModel"]}, 1, "unsupported architecture 'GPT2LMHeadModel'"),
    ({"max_position_embeddings": None}, 1, "set max_model_len"),
])
def test_model_rules_raise_before_any_worker(no_workers, tmp_path, overrides, tp, match):
    model = _model_dir(tmp_path, **overrides)
    with pytest.raises(ConfigError, match=match):
        LLM(model=model, tensor_parallel_size=tp, device="cpu")
    assert no_workers == []


def test_max_model_len_beyond_the_models_positions_is_refused(no_workers, tmp_path):
    """As vLLM: the rotary tables end at max_position_embeddings (2048 here)."""
    model = _model_dir(tmp_path)
    with pytest.raises(ConfigError, match="max_model_len 4096 is longer than .* 2048 positions"):
        LLM(model=model, device="cpu", max_model_len=4096)
    assert no_workers == []


def test_missing_model_and_hub_id_get_a_hint(no_workers, tmp_path):
    with pytest.raises(ConfigError, match="looks like a Hugging Face hub id.*--local-dir"):
        LLM(model="HuggingFaceTB/SmolLM2-135M")
    with pytest.raises(ConfigError, match="missing .*config.json"):
        LLM(model=str(tmp_path))
    assert no_workers == []


def test_a_cache_given_in_blocks_must_hold_max_model_len_before_any_worker(no_workers):
    """As vLLM: one request of max_model_len tokens must fit (tiny: 4096)."""
    with pytest.raises(ConfigError, match=r"the KV cache holds 64 tokens \(4 blocks of 16\), "
                                          "fewer than max_model_len 4096: set max_model_len "
                                          "to at most 64, or raise num_gpu_blocks_override"):
        LLM(model="tiny", device="cpu", num_gpu_blocks_override=4)
    assert no_workers == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("max_model_len, match", [
    (None, r"the KV cache holds 0 tokens \(0 blocks of 16\), fewer than max_model_len 4096: "
           "raise kv_cache_memory_bytes$"),
    (-1, "max_model_len auto: the KV cache holds 0 token .* raise kv_cache_memory_bytes$"),
])
def test_a_budget_of_no_block_is_the_same_config_error(max_model_len, match):
    """1 byte holds no block: refused by the engine's rule, before a cache of
    none is allocated (in process: TP=1)."""
    with pytest.raises(ConfigError, match=match):
        LLM(model="tiny", device="cpu", kv_cache_memory_bytes=1, max_model_len=max_model_len)


@pytest.mark.timeout(120)
def test_a_measured_cache_must_hold_max_model_len_and_nothing_is_left():
    """1 MiB a rank of tiny's cache at TP=2 is 128 blocks of 16 tokens (each
    rank holds half the KV heads); the workers that measured it are stopped.
    With max_model_len 2048 the same cache serves."""
    from tests.helpers.proc_utils import child_pids

    with pytest.raises(ConfigError, match="the KV cache holds 2048 tokens .* set max_model_len "
                                          "to at most 2048, or raise kv_cache_memory_bytes"):
        LLM(model="tiny", device="cpu", tensor_parallel_size=2, kv_cache_memory_bytes=1 << 20)
    assert child_pids(os.getpid()) == []
    with LLM(model="tiny", device="cpu", tensor_parallel_size=2, kv_cache_memory_bytes=1 << 20,
             max_model_len=2048) as llm:
        out = llm.generate("hi", SamplingParams(max_tokens=2, temperature=0.0))[0]
    assert len(out.outputs[0].token_ids) == 2


def test_triton_attention_on_the_cpu_needs_the_interpreter(monkeypatch):
    for name in ("triton", "triton_flash_prefill"):
        config = EngineConfig(model="tiny", device="cpu", attention_backend=name)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(ConfigError, match=f"'{name}' runs on CUDA .*TRITON_INTERPRET=1"):
            config.check_machine()
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        config.check_machine()  # the interpreter runs it (the tests' way)


def test_cuda_without_cuda_is_a_config_error(no_workers, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        LLM(model="tiny", device="cuda")
    assert no_workers == []


def test_too_few_cuda_devices_is_a_config_error_whether_asked_or_chosen(no_workers,
                                                                       monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for device in ("cuda", "auto"):
        with pytest.raises(ConfigError, match="tensor-parallel size 2 needs as many CUDA "
                                              "devices; this machine has 1 .*--device cpu"):
            LLM(model="tiny", device=device, tensor_parallel_size=2)
    assert no_workers == []


def test_projections_come_from_the_config(tmp_path):
    from checkpoint.description import describe

    config = EngineConfig(model="m", block_size=32, max_num_seqs=4, scheduling_policy="priority",
                          enable_prefix_caching=False)
    info = describe(_model_dir(tmp_path, num_attention_heads=8, num_key_value_heads=4,
                               torch_dtype="bfloat16"))
    runner = config.runner_config("/models/m", info)
    assert (runner.model, runner.block_size, runner.max_num_seqs, runner.max_model_len) == (
        "/models/m", 32, 4, 2048)
    assert runner.model_config == info and runner.dtype == "bfloat16"  # "auto" resolved
    # Every other runner field is the engine config's field of the same name.
    assert runner.max_cudagraph_capture_size is None and runner.seed == config.seed
    scheduler = config.scheduler_config(info, num_blocks=7)
    assert (scheduler.policy, scheduler.num_blocks, scheduler.enable_prefix_caching) == (
        "priority", 7, False)


@pytest.mark.parametrize("device, given, budget", [
    ("cpu", None, 2048), ("cuda", None, 8192), ("cuda", 512, 512), ("cpu", 4096, 4096)])
def test_token_budget_default_follows_the_device(tmp_path, device, given, budget):
    """max_num_batched_tokens left unset is 8192 on CUDA and 2048 elsewhere;
    both projections carry the resolved value, a given one unchanged."""
    from checkpoint.description import describe

    config = EngineConfig(model="m", device=device, max_num_batched_tokens=given)
    info = describe(_model_dir(tmp_path))
    assert config.runner_config("/models/m", info).max_num_batched_tokens == budget
    assert config.scheduler_config(info, num_blocks=7).max_num_batched_tokens == budget


def test_runner_config_crosses_the_socket_typed(tmp_path):
    config = runner_config(_model_dir(tmp_path), block_size=32, max_model_len=100)
    message = decode_broadcast(encode(ControlCall(call_id=3, method="load_model",
                                                  kwargs={"config": config})))
    assert isinstance(message.kwargs["config"], RunnerConfig)
    assert message.kwargs["config"] == config


def test_cli_options_are_the_config_fields():
    args = build_parser().parse_args(
        ["--nproc-per-node", "2", "generate", "--model", "tiny", "--block-size", "32",
         "--scheduling-policy", "priority", "--no-enable-prefix-caching", "--attach-workers", "/tmp/x",
         "--step-timeout", "5", "--max-model-len", "64", "--max-cudagraph-capture-size", "24"])
    config = _engine_config(args)
    assert config == EngineConfig(
        model="tiny", tensor_parallel_size=2, block_size=32, scheduling_policy="priority",
        enable_prefix_caching=False, attach_workers_dir="/tmp/x", step_timeout_s=5.0,
        max_model_len=64, executor="mp", max_cudagraph_capture_size=24)


def test_scheduling_policy_reaches_the_scheduler(tmp_path, monkeypatch):
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path))
    with LLM(model="tiny", device="cpu", scheduling_policy="priority",
             kv_cache_memory_bytes=1 << 22) as llm:
        assert llm.engine.scheduler.config.policy == "priority"


@pytest.mark.timeout(120)
def test_generate_runs_prompts_in_priority_order(tmp_path, monkeypatch):
    """One sequence at a time, two prompts sharing 48 tokens: the one run
    second finds them in the prefix cache, so ``num_cached_tokens`` tells
    the order; lower priority values run first. Under "fcfs" a priority is
    refused, as vLLM refuses it."""
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path))

    def sharing(first: int) -> list[dict]:  # two prompts with 48 tokens in common
        shared = list(range(first, first + 48))
        return [{"prompt_token_ids": shared + [1, 2]}, {"prompt_token_ids": shared + [3, 4]}]

    params = SamplingParams(temperature=0.0, max_tokens=2)
    prompts = sharing(10)
    with LLM(model="tiny", device="cpu", scheduling_policy="priority", max_num_seqs=1,
             kv_cache_memory_bytes=1 << 22) as llm:
        for first, priority, second in ((10, [5, -1], 0), (100, [0, 3], 1)):
            outs = llm.generate(sharing(first), params, priority=priority)
            assert [o.num_cached_tokens > 0 for o in outs] == [i == second for i in range(2)]
            assert outs[second].num_cached_tokens == 48
        with pytest.raises(ValueError, match="one priority a prompt"):
            llm.generate(prompts, params, priority=[1])
    with LLM(model="tiny", device="cpu", kv_cache_memory_bytes=1 << 22) as llm:
        with pytest.raises(ValueError, match="priority 2 needs the 'priority' scheduling"):
            llm.generate(prompts, params, priority=[0, 2])
        assert llm.generate(prompts, params, priority=[0, 0])[1].outputs[0].token_ids


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, message", [
    (["--nproc-per-node", "2", "generate", "--block-size", "12"],
     "block_size must be a power of two, got 12"),
    (["--nproc-per-node", "3", "generate", "--device", "cpu"],
     "tiny has 4 attention heads, which do not divide by the tensor-parallel size 3"),
    (["generate", "--device", "cuda"], "CUDA is not available"),
    (["generate", "--model", "HuggingFaceTB/SmolLM2-135M"], "huggingface-cli download"),
    (["generate", "--nproc-per-node", "2"], "put it before the subcommand"),
    (["generate", "--device", "cpu", "--max-tokens", "0"], "max_tokens must be an int >= 1"),
    (["generate", "--device", "cpu", "--prompt-token-ids", "1,x"],
     "--prompt-token-ids must be comma-separated integers"),
    (["bench", "--device", "cpu", "--num-prompts", "0"], "num_prompts must be an int >= 1"),
    (["bench", "--device", "cpu", "--dataset", "missing.jsonl"],
     "dataset 'missing.jsonl' is not a file"),
    (["serve", "--device", "cpu", "--http-port", "70000"], "--http-port must be in [0, 65535]"),
    (["serve", "--device", "cpu", "--api-key", "k"], "--api-key needs --http-port"),
    (["serve", "--device", "cpu", "--served-model-name", "m"], "--served-model-name needs --http-port"),
    (["serve", "--device", "cpu", "--allowed-origins", "*"], "--allowed-origins needs --http-port"),
    (["serve", "--device", "cpu", "--enable-server-load-tracking"],
     "--enable-server-load-tracking needs --http-port"),
    (["serve", "--device", "cpu", "--http-port", "0", "--served-model-name", " "],
     "--served-model-name takes non-empty names"),
    (["serve", "--device", "cpu", "--port", "70000"], "--port must be in [0, 65535]"),
    (["serve", "--device", "cpu", "--endpoint-file", "/no-such-dir-here/ep"],
     "--endpoint-file /no-such-dir-here/ep: directory /no-such-dir-here does not exist"),
    (["serve", "--device", "cpu", "--port", "18777", "--http-port", "18777"],
     "--port 18777 and --http-port 18777 are the same port"),
    (["generate", "--device", "cpu", "--seed", "-1"], "seed must be an int in [0, 2**63)"),
    (["generate", "--device", "cpu", "--attention-backend", "flash_attn"],
     "'flash_attn' runs on CUDA only"),
    (["--master-addr", "999.1.1.1", "generate", "--device", "cpu"],
     "master_addr '999.1.1.1' does not resolve"),
])
def test_cli_config_errors_are_one_line_with_exit_code_2(tmp_path, args, message):
    _one_line_with_exit_code_2(tmp_path, args, message)


@pytest.mark.timeout(120)
def test_an_endpoint_file_that_is_a_directory_is_one_line_with_exit_code_2(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    _one_line_with_exit_code_2(tmp_path, ["serve", "--device", "cpu", "--endpoint-file",
                                          str(folder)],
                               f"--endpoint-file {folder} is a directory: give the path of a "
                               "file to write")


def _one_line_with_exit_code_2(tmp_path, args: list[str], message: str) -> None:
    env = {"TPRUN_CACHE": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    result, leftovers = run_tprun(args, timeout=100, env=env)
    assert result.returncode == 2, result.stderr
    # One error line, the last; any line before it is generate's notice of
    # what it runs ("tprun generate: ..."), never a traceback.
    *notices, error = result.stderr.strip().splitlines()
    assert error.startswith("tprun: error: ") and message in error, result.stderr
    assert all(line.startswith("tprun generate: ") for line in notices), result.stderr
    assert leftovers == []
