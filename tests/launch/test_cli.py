"""The tprun CLI: torchrun-style flags, generate, --json."""

import json
import re

import pytest

from tests.helpers.proc_utils import run_tprun


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_generate_json_tp2_one_object_per_prompt(tmp_path):
    result, leftovers = run_tprun(
        ["--nproc-per-node", "2", "generate", "--model", "tiny", "--device", "cpu",
         "--prompt", "Hello, my name is", "--prompt", "héllo wörld",
         "--prompt-token-ids", "1,2,3", "--max-tokens", "6", "--ignore-eos", "--json"],
        timeout=100, env={"TPRUN_CACHE": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 3
    objects = [json.loads(line) for line in lines]
    for i, obj in enumerate(objects):
        assert set(obj) == {"index", "prompt_token_ids", "token_ids", "text", "finish_reason"}
        assert obj["index"] == i
        assert len(obj["token_ids"]) == 6 and obj["finish_reason"] == "length"
        assert isinstance(obj["text"], str)
    assert objects[2]["prompt_token_ids"] == [1, 2, 3]
    assert leftovers == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_generate_tp1_and_tp2_agree(tmp_path):
    outputs = []
    for n in ("1", "2"):
        result, leftovers = run_tprun(
            ["--nproc-per-node", n, "generate", "--model", "tiny", "--device", "cpu",
             "--prompt", "The capital of France is", "--max-tokens", "8", "--json"],
            timeout=100, env={"TPRUN_CACHE": str(tmp_path)},
        )
        assert result.returncode == 0, result.stderr
        assert leftovers == []
        outputs.append(json.loads(result.stdout.splitlines()[-1])["token_ids"])
    assert outputs[0] == outputs[1]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_bad_prompt_token_ids_is_a_clear_error(tmp_path):
    result, leftovers = run_tprun(
        ["--nproc-per-node", "1", "generate", "--model", "tiny", "--device", "cpu",
         "--prompt-token-ids", "1,99999", "--max-tokens", "4"],
        timeout=50, env={"TPRUN_CACHE": str(tmp_path)},
    )
    assert result.returncode == 2  # the user's input
    assert "outside the vocabulary" in result.stderr.splitlines()[-1]
    assert result.stderr.splitlines()[-1].startswith("tprun: error:")
    assert leftovers == []


@pytest.mark.timeout(120)
def test_generate_with_constraints(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                  "required": ["ok"], "additionalProperties": False}))
    runs = {"choice": ["--choice", "red", "green", "light blue"],
            "regex": ["--regex", "[0-9]{3}-[a-z]{2}"],
            "json": ["--json-schema", str(schema), "--max-tokens", "200"]}
    texts = {}
    for name, flags in runs.items():
        result, leftovers = run_tprun(
            ["generate", "--model", "tiny", "--device", "cpu", "--prompt", "Go:",
             "--temperature", "1", "--sampling-seed", "3", "--json", *flags],
            timeout=100, env={"TPRUN_CACHE": str(tmp_path)})
        assert result.returncode == 0, result.stderr
        assert leftovers == []
        texts[name] = json.loads(result.stdout.splitlines()[-1])
    assert texts["choice"]["text"] in ("red", "green", "light blue")
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", texts["regex"]["text"])
    if texts["json"]["finish_reason"] == "stop":
        assert json.loads(texts["json"]["text"]) in ({"ok": True}, {"ok": False})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flags, code, message", [
    (["--json-schema", "/nonexistent/schema.json"], 2, "--json-schema /nonexistent"),
    (["--regex", "a", "--choice", "b"], 2, "not allowed with argument"),
    (["--choice"], 2, "expected at least one argument"),
    (["--regex", "[a-"], 2, "invalid regex"),
])
def test_bad_constraint_flags_are_one_line_errors(tmp_path, flags, code, message):
    result, leftovers = run_tprun(
        ["generate", "--model", "tiny", "--device", "cpu", "--max-tokens", "4", *flags],
        timeout=100, env={"TPRUN_CACHE": str(tmp_path)})
    assert result.returncode == code, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert leftovers == []
