"""Shared test set-up.

Without CUDA, Triton kernels run under the interpreter: TRITON_INTERPRET must
be set before any kernel module is imported, so it is set here, first.
"""

import os
import shutil
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_TMP_ROOT = pytest.StashKey[str]()


def pytest_configure(config):
    """Every temporary file of the run, the tests' own and those of the
    processes they start (TMPDIR is inherited), goes into one folder that
    is removed when the run ends: the suite leaves nothing in /tmp."""
    root = tempfile.mkdtemp(prefix="tprun-tests-")
    config.stash[_TMP_ROOT] = root
    os.environ["TMPDIR"] = root
    tempfile.tempdir = root
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(root, "pytest")


def pytest_unconfigure(config):
    root = config.stash.get(_TMP_ROOT, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
