"""The tprun CLI: torchrun-style flags, generate, --json."""

import json

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
