"""``speculative_config`` as vLLM spells it: checked by ``EngineConfig``
before any worker starts (``ValueError`` from ``LLM``; one ``tprun:
error:`` line and exit code 2 from every CLI subcommand), and projected
into the runner's and the scheduler's typed configs."""

from __future__ import annotations

import json

import pytest

from engine import LLM, SamplingParams
from engine.config import DEFAULT_PROMPT_LOOKUP, EngineConfig
from ipc.config import MAX_SPECULATIVE_TOKENS, RunnerConfig
from ipc.messages import ControlCall
from ipc.serde import decode_broadcast, encode
from launch.cli import _engine_config, build_parser
from tests.engine.test_engine_config import _model_dir
from tests.helpers.proc_utils import run_tprun

BAD = [
    ({"method": "eagle", "num_speculative_tokens": 2}, "method must be one of"),
    ({"num_speculative_tokens": 2}, "method must be one of"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an int"),
    ({"method": "ngram", "num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1},
     f"in 1..{MAX_SPECULATIVE_TOKENS}"),
    ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens must be"),
    ({"method": "ngram"}, "needs num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
      "prompt_lookup_max": 2}, "prompt_lookup_min 4 > prompt_lookup_max 2"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0},
     "prompt_lookup_min must be"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": -3},
     r"prompt_lookup_max must be an int in 1\.\.16, got -3"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 40},
     r"prompt_lookup_max must be an int in 1\.\.16, got 40"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "tiny"}, "unknown key"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs a 'model'"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": "/no/such/model"},
     "does not exist"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0},
     "disable_by_batch_size must be an int >= 1"),
    ("[1, 2]", "must be an object"),
    ("{not json", "not valid JSON"),
]


@pytest.mark.parametrize("value, match", BAD)
def test_bad_speculative_config_raises_from_llm_before_any_worker(no_workers,  # noqa: F811
                                                                   value, match):
    with pytest.raises(ValueError, match=match):
        LLM(model="tiny", speculative_config=value)
    assert no_workers == []


def test_ngram_bounds_default_as_vllm():
    one = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                           "prompt_lookup_max": 4}).speculative
    assert (one.prompt_lookup_min, one.prompt_lookup_max) == (4, 4)
    none = EngineConfig(speculative_config={"method": "ngram",
                                            "num_speculative_tokens": 2}).speculative
    assert none.prompt_lookup_min == none.prompt_lookup_max == DEFAULT_PROMPT_LOOKUP
    assert EngineConfig().speculative is None


def test_speculative_config_reaches_runner_and_scheduler(tmp_path):
    from checkpoint.description import describe

    config = EngineConfig(model="m", speculative_config=json.dumps(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5,
         "prompt_lookup_min": 2}))
    info = describe(_model_dir(tmp_path, num_attention_heads=8, num_key_value_heads=4))
    runner = config.runner_config("/models/m", info)
    assert runner.num_speculative_tokens == 3
    assert (runner.speculative.prompt_lookup_min, runner.speculative.prompt_lookup_max) == (2, 5)
    assert config.scheduler_config(info, num_blocks=7).num_speculative_tokens == 3
    assert config.scheduler_config(info, num_blocks=7).spec_disable_by_batch_size == 0
    limited = EngineConfig(model="m", speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 64})
    assert limited.scheduler_config(info, num_blocks=7).spec_disable_by_batch_size == 64
    # It crosses the socket typed, inside load_model's RunnerConfig.
    call = decode_broadcast(encode(ControlCall(call_id=1, method="load_model",
                                               kwargs={"config": runner})))
    assert isinstance(call.kwargs["config"], RunnerConfig)
    assert call.kwargs["config"].speculative == runner.speculative


def test_cli_option_is_generated_from_the_field():
    text = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'
    for command in ("generate", "serve", "bench"):
        args = build_parser().parse_args(["--nproc-per-node", "1", command,
                                          "--speculative-config", text])
        assert _engine_config(args).speculative.num_speculative_tokens == 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_cli_bad_speculative_config_is_one_line_exit_2(tmp_path, command):
    env = {"TPRUN_CACHE": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    args = ["--nproc-per-node", "1", command, "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, '
            '"prompt_lookup_max": 1}']
    result, leftovers = run_tprun(args, timeout=100, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("tprun: error: ")
    assert "prompt_lookup_min 3 > prompt_lookup_max 1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert leftovers == []


@pytest.mark.timeout(300)
def test_cli_generate_with_ngram_drafts(tmp_path):
    env = {"TPRUN_CACHE": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    base = ["--nproc-per-node", "1", "generate", "--prompt", "abcabcabcabc", "--max-tokens",
            "16", "--temperature", "0", "--json"]
    plain, _ = run_tprun(base, timeout=200, env=env)
    spec, _ = run_tprun(base + ["--speculative-config",
                                '{"method": "ngram", "num_speculative_tokens": 3}'],
                        timeout=200, env=env)
    assert plain.returncode == spec.returncode == 0, spec.stderr
    assert json.loads(spec.stdout)["token_ids"] == json.loads(plain.stdout)["token_ids"]


def _draft(tmp_path, **overrides) -> dict:
    """A draft-model speculative_config whose model has tiny's vocabulary
    (config.json only: what the checks read)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    model = _model_dir(tmp_path, vocab_size=320, num_attention_heads=4, num_key_value_heads=2,
                       hidden_size=64, intermediate_size=128, **overrides)
    return {"method": "draft_model", "model": model, "num_speculative_tokens": 2}


def test_draft_max_model_len_by_hand(tmp_path):
    """Hand-worked, tiny (4096 positions) as the target: a draft of 64
    positions bounds where requests draft, min(64, max_model_len), never the
    length they get, given, the default (tiny's 4096) or "auto" (the least
    of the cache, 100 blocks of 16 = 1600 tokens, and tiny's positions); a
    draft whose config gives no positions, and n-gram drafts, bound nothing
    short of max_model_len. The runner's bound is taken against the length
    its tables are sized for (tiny's positions under "auto")."""
    from checkpoint.description import describe
    from checkpoint.tiny_model import CONFIG as TINY_CONFIG

    (tmp_path / "tiny").mkdir()
    tiny = describe(_model_dir(tmp_path / "tiny", **TINY_CONFIG))
    spec = _draft(tmp_path / "short", max_position_embeddings=64)
    short = describe(spec["model"])
    unknown = describe(_draft(tmp_path / "unknown", max_position_embeddings=None)["model"])

    def lengths(max_model_len, draft, num_blocks=300):
        config = EngineConfig(model="tiny", max_model_len=max_model_len, speculative_config=spec)
        config.check_draft_model(tiny, draft)  # no length is refused
        scheduler = config.scheduler_config(tiny, num_blocks, draft)
        runner = config.runner_config("/models/tiny", tiny, spec["model"], draft)
        return (scheduler.max_model_len, scheduler.draft_max_model_len,
                runner.max_model_len, runner.speculative.draft_max_model_len)

    assert lengths(None, short) == (4096, 64, 4096, 64)
    assert lengths(128, short) == (128, 64, 128, 64)
    assert lengths(32, short) == (32, 32, 32, 32)
    assert lengths(-1, short, num_blocks=100) == (1600, 64, 4096, 64)
    assert lengths(-1, short, num_blocks=2) == (32, 32, 4096, 64)
    assert lengths(None, unknown) == (4096, 4096, 4096, 4096)
    ngram = EngineConfig(model="tiny", max_model_len=128, speculative_config={
        "method": "ngram", "num_speculative_tokens": 2})
    assert ngram.scheduler_config(tiny, 300).draft_max_model_len == 128


def test_a_draft_whose_heads_do_not_split_is_named(tmp_path):
    from checkpoint.description import describe
    from checkpoint.tiny_model import CONFIG as TINY_CONFIG
    from engine.config import ConfigError

    (tmp_path / "tiny").mkdir()
    tiny = describe(_model_dir(tmp_path / "tiny", **TINY_CONFIG))
    spec = _draft(tmp_path / "draft")
    config = EngineConfig(model="tiny", tensor_parallel_size=3, speculative_config=spec)
    with pytest.raises(ConfigError, match=rf"^speculative_config: draft model "
                                          rf"'{spec['model']}' has 4 attention heads, which do "
                                          "not divide by the tensor-parallel size 3$"):
        config.check_draft_model(tiny, describe(spec["model"]))


@pytest.mark.timeout(300)
def test_cli_generate_with_a_draft_of_fewer_positions_than_max_model_len(tmp_path):
    """--max-model-len 128 with a draft of 64 positions (tiny's weights):
    the command starts and prints the tokens a run without drafts gives."""
    from tests.engine.test_spec_decode import tiny_with_positions

    env = {"TPRUN_CACHE": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": ""}
    draft = tiny_with_positions(tmp_path / "draft", 64)
    prompt = list(range(40, 82))
    with LLM(model="tiny", device="cpu") as llm:
        want = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
            temperature=0.0, max_tokens=60, ignore_eos=True))[0].outputs[0].token_ids
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}
    args = ["--nproc-per-node", "1", "generate", "--model", "tiny", "--device", "cpu",
            "--max-model-len", "128", "--prompt-token-ids", ",".join(map(str, prompt)),
            "--max-tokens", "60", "--temperature", "0", "--ignore-eos", "--json",
            "--speculative-config", json.dumps(spec)]
    result, leftovers = run_tprun(args, timeout=200, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["token_ids"] == want
    assert leftovers == []
