"""``tprun generate --enable-lora --lora-modules NAME=PATH``: every prompt
runs with the adapter and gets HF's greedy tokens of the model with it
merged; more than one adapter, or one without --enable-lora, is one
``tprun: error:`` line before anything starts, and a bad adapter one
naming the option once the model has loaded."""

from __future__ import annotations

import json

import pytest

from tests.helpers.lora_adapters import model_with_adapters
from tests.helpers.proc_utils import run_tprun

PROMPTS = [[5, 17, 99, 3], list(range(1, 30))]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate-lora")
    return root, *model_with_adapters(root, PROMPTS, MAX_TOKENS)


def _generate(root, model_dir: str, *options: str, timeout: float = 180):
    argv = ["generate", "--model", model_dir, "--device", "cpu", "--json", "--ignore-eos",
            "--max-tokens", str(MAX_TOKENS),
            *(a for p in PROMPTS for a in ("--prompt-token-ids", ",".join(map(str, p)))),
            *options]
    result, leftovers = run_tprun(argv, timeout=timeout, env={"TPRUN_CACHE": str(root / "cache")})
    assert leftovers == []
    return result


@pytest.mark.timeout(300)
def test_every_prompt_runs_with_the_adapter(model):
    root, model_dir, paths, expected = model
    for lora_id in (2, 3):
        result = _generate(root, model_dir, "--enable-lora", "--lora-modules",
                           f"adapter={paths[lora_id]}")
        assert result.returncode == 0, result.stderr
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert [line["token_ids"] for line in lines] == expected[lora_id]


@pytest.mark.timeout(300)
def test_adapter_options_the_run_cannot_take_are_one_error_line(model):
    root, model_dir, paths, _ = model
    for options, message in (
            (["--lora-modules", f"a={paths[1]}"], "--lora-modules needs --enable-lora"),
            (["--enable-lora", "--lora-modules", f"a={paths[1]}", f"b={paths[2]}"],
             "generate runs every prompt with one adapter")):
        result = _generate(root, model_dir, *options, timeout=60)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines()[-1].startswith(f"tprun: error: {message}")
    result = _generate(root, model_dir, "--enable-lora", "--max-lora-rank", "8",
                       "--lora-modules", f"big={paths[3]}")
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and result.stdout == ""
    assert last.startswith("tprun: error: --lora-modules big: ") and "max_lora_rank 8" in last
