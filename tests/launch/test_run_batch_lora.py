"""``tprun run-batch --enable-lora --lora-modules NAME=PATH``, as vLLM's
run-batch: a line whose body's ``model`` names an adapter runs with it and
gets HF's greedy tokens of the model with that adapter merged, the base
name the base model's, an unknown name the server's 404 error line; a bad
module stops the run before any line, one ``tprun: error:`` line."""

from __future__ import annotations

import json

import pytest

from tests.helpers.lora_adapters import model_with_adapters
from tests.helpers.proc_utils import run_tprun

PROMPTS = [[5, 17, 99, 3], list(range(1, 30))]
MAX_TOKENS = 6
# (custom_id, the body's model, the adapter id its tokens are HF's of; None: the base model)
LINES = [("sql", "sql", 1), ("base", "base", None), ("mlp", "mlp", 3), ("sql-again", "sql", 1)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("run-batch-lora")
    return root, *model_with_adapters(root, PROMPTS, MAX_TOKENS)


def _request(custom_id: str, model: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": {"model": model, "prompt": PROMPTS, "max_tokens": MAX_TOKENS,
                                "temperature": 0, "ignore_eos": True,
                                "return_token_ids": True}}) + "\n"


@pytest.mark.timeout(300)
def test_lines_run_the_adapter_their_model_names(model):
    root, model_dir, paths, expected = model
    source, target = root / "in.jsonl", root / "out.jsonl"
    source.write_text("".join(_request(c, m) for c, m, _ in LINES) + _request("nope", "nope"))
    result, leftovers = run_tprun(["run-batch", "-i", str(source), "-o", str(target),
                                   "--model", model_dir, "--served-model-name", "base",
                                   "--device", "cpu", "--enable-lora", "--max-loras", "2",
                                   "--lora-modules", f"sql={paths[1]}",
                                   f'{{"name": "mlp", "path": "{paths[3]}"}}'],
                                  timeout=240, env={"TPRUN_CACHE": str(root / "cache")})
    assert leftovers == [] and result.returncode == 0, result.stderr
    outputs = {o["custom_id"]: o for o in map(json.loads, target.read_text().splitlines())}
    for custom_id, name, lora_id in LINES:
        response = outputs[custom_id]["response"]
        assert response["status_code"] == 200, outputs[custom_id]
        assert response["body"]["model"] == name
        assert [c["token_ids"] for c in response["body"]["choices"]] == expected[lora_id]
    assert outputs["nope"]["response"]["status_code"] == 404
    assert "'nope' is not served here" in outputs["nope"]["error"]["error"]["message"]


@pytest.mark.timeout(300)
def test_a_bad_module_stops_the_run_before_any_line(model, tmp_path):
    root, model_dir, paths, _ = model
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(_request("sql", "sql"))
    base = ["run-batch", "-i", str(source), "-o", str(target), "--model", model_dir,
            "--device", "cpu"]
    env = {"TPRUN_CACHE": str(root / "cache")}
    result, leftovers = run_tprun([*base, "--lora-modules", f"sql={paths[1]}"], timeout=60,
                                  env=env)
    assert result.returncode == 2 and leftovers == []
    assert result.stderr.strip().splitlines()[-1] == (
        "tprun: error: --lora-modules needs --enable-lora")
    result, leftovers = run_tprun([*base, "--enable-lora", "--max-lora-rank", "8",
                                   "--lora-modules", f"big={paths[3]}"], timeout=120, env=env)
    assert result.returncode == 2 and leftovers == []
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("tprun: error: --lora-modules big: ") and "max_lora_rank 8" in last
    assert not target.exists() or target.read_text() == ""
