"""benchmarks/ab_decode.py on CPU: a revision exported as it was committed,
then bench_decode run alternately from that tree and the working tree, and
the rows compared."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.proc_utils import ROOT, run_in_session


def test_export_tree_holds_the_revision(tmp_path):
    from benchmarks.ab_decode import export_tree

    export_tree("HEAD", str(tmp_path))
    committed = subprocess.run(["git", "-C", ROOT, "show", "HEAD:benchmarks/bench_decode.py"],
                               capture_output=True, check=True, text=True).stdout
    assert (tmp_path / "benchmarks" / "bench_decode.py").read_text() == committed


def test_base_tree_is_a_directory_as_given_or_an_export(tmp_path):
    from benchmarks.ab_decode import base_tree

    given = tmp_path / "given"
    given.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert base_tree(str(given), str(scratch)) == str(given)
    assert not any(scratch.iterdir())  # nothing exported for a directory
    assert base_tree("HEAD", str(scratch)) == str(scratch)
    assert (scratch / "benchmarks" / "ab_decode.py").is_file()


def test_compare_takes_each_sides_median():
    from benchmarks.ab_decode import compare

    row = ("tiny", 1, 16)
    runs = [("base", {row: 2.0}), ("change", {row: 1.0}), ("base", {row: 4.0}),
            ("change", {row: 1.5}), ("base", {row: 3.0, ("tiny", 8, 16): 5.0}),
            ("change", {row: 2.5})]
    (result,) = compare(runs)  # the batch-8 row is not in every run
    assert result["runs"] == [["base", 2.0], ["change", 1.0], ["base", 4.0], ["change", 1.5],
                              ["base", 3.0], ["change", 2.5]]
    assert (result["base_ms"], result["change_ms"], result["change_over_base"]) == (3.0, 1.5,
                                                                                     0.5)


@pytest.mark.timeout(600)
def test_one_pair_on_cpu(tmp_path):
    out_dir = tmp_path / "ab"
    result, leftovers = run_in_session(
        [sys.executable, "-m", "benchmarks.ab_decode", "--base", "HEAD", "--pairs", "1",
         "--out-dir", str(out_dir), "--", "--shape", "tiny", "--device", "cpu", "--dtype",
         "float32", "--batches", "1", "--contexts", "16", "--steps", "2", "--rounds", "1",
         "--bandwidth-mib", "16"], timeout=580)
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    (row,) = summary["rows"]
    runs = {side: json.loads((out_dir / f"{side}_0.json").read_text())["results"][0]["step_ms"]
            for side in ("base", "change")}
    assert row["runs"] == [["base", runs["base"]], ["change", runs["change"]]]
    assert row["change_over_base"] == round(runs["change"] / runs["base"], 4)


def test_refuses_an_out_of_its_own(capsys):
    from benchmarks.ab_decode import main

    with pytest.raises(SystemExit):
        main(["--out-dir", "x", "--", "--out", "y.json"])
    assert "--out-dir" in capsys.readouterr().err
