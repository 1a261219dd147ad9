"""``launch/data_parallel.py`` and ``serve -dp``'s checks, without a server:
the parent's private directory is one a later launch recognizes as stale.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ipc.endpoints import remove_stale_directories
from tests.helpers.proc_utils import ROOT, pythonpath

# A parent that made its replicas' directory (no replica: -dp 1) and was
# killed before its cleanup: the directory stays behind, with its owner gone.
_KILLED_PARENT = """
import argparse, os, signal
from launch.data_parallel import ReplicaProcesses
replicas = ReplicaProcesses(argparse.Namespace(), tp=1, dp=1, device="cpu")
open(os.path.join(replicas.directory, "replica-1.key"), "w").write("secret")
print(replicas.directory, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(60)
def test_a_killed_parents_replica_directory_is_removed_by_the_next_launch(tmp_path, monkeypatch):
    run = subprocess.run([sys.executable, "-c", _KILLED_PARENT], cwd=ROOT, capture_output=True,
                         text=True, timeout=60,
                         env=dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=pythonpath()))
    directory = run.stdout.strip()
    assert run.returncode == -9 and os.path.dirname(directory) == str(tmp_path), run.stderr
    assert os.path.isdir(directory)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    assert remove_stale_directories() == [directory]
    assert os.listdir(tmp_path) == []
