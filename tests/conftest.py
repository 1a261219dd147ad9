"""Shared test set-up and the fixtures of every folder.

Without CUDA, Triton kernels run under the interpreter: TRITON_INTERPRET must
be set before any kernel module is imported, so it is set here, first.
"""

import os
import re
import shutil
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_TMP_ROOT = pytest.StashKey[str]()


def _remove_folders_of_dead_runs() -> None:
    """A run killed before its end leaves its folder; the next run removes
    it (only when the run's pid, in the name, is gone)."""
    parent = tempfile.gettempdir()
    for name in os.listdir(parent):
        match = re.fullmatch(r"tprun-tests-(\d+)-[^-]+", name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except PermissionError:
            pass


def pytest_configure(config):
    """Every temporary file of the run, the tests' own and those of the
    processes they start (TMPDIR is inherited), goes into one folder that
    is removed when the run ends: the suite leaves nothing in /tmp."""
    _remove_folders_of_dead_runs()
    root = tempfile.mkdtemp(prefix=f"tprun-tests-{os.getpid()}-")
    config.stash[_TMP_ROOT] = root
    os.environ["TMPDIR"] = root
    tempfile.tempdir = root
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(root, "pytest")


def pytest_unconfigure(config):
    root = config.stash.get(_TMP_ROOT, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    """The embedded ``tiny`` model, written into a fresh cache of the module."""
    from checkpoint.tiny_model import ensure_tiny_model

    return ensure_tiny_model(str(tmp_path_factory.mktemp("cache")))
