"""``launch/data_parallel.py`` and ``serve -dp``'s checks, without a server:
the parent's private directory is one a later launch recognizes as stale;
each replica's CUDA devices; too few devices refused.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types

import pytest
import torch

from engine.config import ConfigError
from ipc.endpoints import remove_stale_directories
from launch.cli import _check_data_parallel
from launch.data_parallel import replica_devices
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


@pytest.mark.parametrize("given, devices", [
    (None, ["0,1", "2,3", "4,5"]),
    ("2,3,4,5,6,7", ["2,3", "4,5", "6,7"]),
    ("GPU-a1,GPU-b2,GPU-c3,GPU-d4,GPU-e5,GPU-f6", ["GPU-a1,GPU-b2", "GPU-c3,GPU-d4",
                                                 "GPU-e5,GPU-f6"]),
])
def test_each_replica_sees_the_devices_of_its_local_ranks(monkeypatch, given, devices):
    """-tp 2 -dp 3: replica d's CUDA_VISIBLE_DEVICES holds the devices of
    local ranks 2d and 2d+1, of those this process sees (as given: indices
    or UUIDs)."""
    if given is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", given)
    assert [replica_devices(d, tp=2, world=6) for d in range(3)] == devices


def test_fewer_cuda_devices_than_every_replicas_ranks_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    args = argparse.Namespace(data_parallel_size=2, http_port=0, port=None, endpoint_file=None)
    config = types.SimpleNamespace(resolved_device="cuda", tensor_parallel_size=2,
                                   attach_workers_dir=None, master_port=None)
    with pytest.raises(ConfigError, match="--tensor-parallel-size 2 x --data-parallel-size 2 "
                                          "needs 4 CUDA devices; this machine has 3"):
        _check_data_parallel(args, config)
