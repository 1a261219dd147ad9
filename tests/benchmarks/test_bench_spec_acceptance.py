"""benchmarks/bench_spec_acceptance.py: its JSON-schema prompt sets are held
to their schema, its JSON check counts what parses and what validates, and
the command reports plain and schema sets side by side (on ``tiny``, whose
random weights never close a JSON object: mechanics, not figures)."""

from __future__ import annotations

import json
import re
import sys

import jsonschema
import pytest

from benchmarks.bench_spec_acceptance import PROMPTS_FILE, json_checks, prompt_set, run_set
from tests.helpers.proc_utils import run_in_session


def _sets() -> dict:
    with open(PROMPTS_FILE) as f:
        return json.load(f)


def test_schema_sets_name_a_schema_and_their_prompts():
    sets = _sets()
    schema_sets = [name for name, entry in sets.items() if isinstance(entry, dict)]
    assert {"json_copy", "json_from_json", "json_chat"} <= set(schema_sets)
    moby_dick = {"title": "Moby-Dick", "author": "Herman Melville", "year": 1851, "pages": 635,
                 "price": 11.25, "genres": ["adventure fiction", "epic", "sea story"]}
    for name in schema_sets:
        texts, schema = prompt_set(sets[name])
        jsonschema.Draft202012Validator.check_schema(schema)
        assert jsonschema.Draft202012Validator(schema).is_valid(moby_dick)
        assert len(texts) == 5 and all(isinstance(t, str) and t for t in texts)
    assert prompt_set(sets["chat"]) == (sets["chat"], None)


def test_json_checks_count_parsed_outputs_and_the_valid_ones():
    _, schema = prompt_set(_sets()["json_copy"])
    record = {"title": "Dracula", "author": "Bram Stoker", "year": 1897, "pages": 418,
              "price": 8.25, "genres": ["Gothic horror"]}
    texts = [
        json.dumps(record, indent=2),                      # parses, valid
        json.dumps(record)[:40],                            # cut off: does not parse
        json.dumps({**record, "year": "1897"}),             # parses, a string year
        json.dumps({k: v for k, v in record.items() if k != "genres"}),  # parses, no genres
        json.dumps({**record, "isbn": "978-0"}),            # parses, a key not named
        json.dumps({**record, "genres": ["a", "b", "c", "d", "e"]}),    # parses, maxItems 4
    ]
    assert json_checks(texts, schema) == {"json_parsed": 5, "json_valid": 1}


@pytest.mark.timeout(120)
def test_a_schema_set_holds_the_output_to_its_schema():
    """Without the schema tiny writes bytes at random; with it every output
    opens the record with its first key (the schema's order)."""
    texts, schema = prompt_set(_sets()["json_from_json"])
    _, _, _, free = run_set("tiny", texts[:2], None, 24, device="cpu")
    _, _, _, held = run_set("tiny", texts[:2], None, 24, schema, device="cpu")
    assert not any(re.sub(r"\s", "", t).startswith('{"title"') for t in free)
    assert all(re.sub(r"\s", "", t).startswith('{"title"') for t in held)


@pytest.mark.timeout(200)
def test_command_reports_plain_and_schema_sets(tmp_path):
    out = tmp_path / "summary.json"
    result, leftovers = run_in_session(
        [sys.executable, "-m", "benchmarks.bench_spec_acceptance", "--model", "tiny",
         "--sets", "copy_heavy,json_from_json", "--max-tokens", "48", "--out", str(out)],
        timeout=180, env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    plain_set, schema_set = json.loads(out.read_text())["sets"]
    assert (plain_set["set"], schema_set["set"]) == ("copy_heavy", "json_from_json")
    assert "structured_outputs" not in plain_set
    assert schema_set["structured_outputs"] == "json"
    assert schema_set["json_valid"] == schema_set["json_parsed"] <= schema_set["prompts"] == 5
    for row in (plain_set, schema_set):
        assert row["outputs_equal_plain"] is True
        assert 0 < row["num_accepted_tokens"] < row["num_draft_tokens"]
        assert sum(row["num_accepted_tokens_per_pos"]) == row["num_accepted_tokens"]
        assert row["acceptance_rate"] == pytest.approx(
            row["num_accepted_tokens"] / row["num_draft_tokens"], abs=1e-4)
        assert row["mean_accepted_length"] == pytest.approx(
            1 + row["num_accepted_tokens"] / row["num_drafts"], abs=1e-3)


@pytest.mark.parametrize("sets, words", [
    ("copy_heavy,json_cpy", "no prompt set 'json_cpy'"),
    ("copy_heavy,json_copy,chat", "the JSON sets json_copy check their outputs with jsonschema"),
])
def test_a_run_that_would_stop_midway_is_refused_before_any_set_runs(monkeypatch, capsys,
                                                                     sets, words):
    """A misspelt set, or a schema set where ``jsonschema`` is missing (it
    is the test extra's), is the usage error before the first set runs,
    not a traceback after the sets before it have run."""
    from benchmarks import bench_spec_acceptance

    def run_set(model, texts, *args, **kwargs):
        raise AssertionError(f"a set ran before the refusal: {texts[0][:40]!r}")

    monkeypatch.setattr(bench_spec_acceptance, "run_set", run_set)
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema: ImportError
    monkeypatch.setattr(sys, "argv", ["bench_spec_acceptance", "--sets", sets])
    with pytest.raises(SystemExit) as exit_:
        bench_spec_acceptance.main()
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err
