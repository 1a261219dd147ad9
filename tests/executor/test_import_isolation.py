"""A caller's folder cannot replace tprun's packages in the workers.

Workers start as ``python -P -m worker`` (or an equivalent before Python
3.11), so a ``worker.py``, ``engine.py``, ``serving.py`` or ``runner.py`` in the folder
tprun runs from is not imported by them. Each decoy here exits with code
3 and says so: had one run, the launch would fail or print it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import executor.multiproc
from executor.multiproc import module_command
from tests.helpers.proc_utils import pythonpath, run_in_session

DECOYS = ("worker", "engine", "runner", "ipc", "executor", "serving", "checkpoint")


def _decoy_folder(path) -> str:
    for name in DECOYS:
        (path / f"{name}.py").write_text(
            f"import sys\nprint('decoy {name}.py ran', file=sys.stderr)\nsys.exit(3)\n")
    return str(path)


def _tprun() -> list[str]:
    """The installed console script when there is one (what users run: its
    folder, not the current one, is first on its path), else the package
    run without the current folder on the path."""
    script = os.path.join(os.path.dirname(sys.executable), "tprun")
    return [script] if os.path.exists(script) else module_command("launch")


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_tprun_from_a_folder_with_decoy_modules(tmp_path):
    (tmp_path / "decoys").mkdir()
    folder = _decoy_folder(tmp_path / "decoys")
    result, leftovers = run_in_session(
        [*_tprun(), "--nproc-per-node", "2", "generate", "--model", "tiny", "--device", "cpu",
         "--prompt-token-ids", "1,2,3", "--max-tokens", "4", "--ignore-eos", "--json"],
        timeout=140, env={"TPRUN_CACHE": str(tmp_path / "cache")}, cwd=folder)
    assert "decoy" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout.splitlines()[-1])["token_ids"]) == 4
    assert leftovers == []


@pytest.mark.timeout(60)
def test_fallback_command_before_python_3_11_ignores_the_folder(tmp_path, monkeypatch):
    """The ``-c`` form (used before ``-P`` existed) also drops the folder."""
    folder = _decoy_folder(tmp_path)
    monkeypatch.setattr(executor.multiproc.sys, "version_info", (3, 10, 0))
    cmd = module_command("worker")
    assert "-P" not in cmd
    result = subprocess.run([*cmd, "--help"], cwd=folder, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=pythonpath()), timeout=50)
    assert "decoy" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    assert "usage: python -m worker" in result.stdout
