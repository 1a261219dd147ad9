"""The device seam (runner/ops.py): the only place that asks which device the
runner runs on, and the CPU path never imports Triton."""

import pathlib
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from runner.input_batch import prepare_prefill_inputs_ref
from runner.ops import device_ops

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEVICE_CHECK = re.compile(r"on_cuda|is_cuda|device\.type|\)\.type\b")


def test_only_the_seam_asks_for_the_device_type():
    found = sorted(
        str(path.relative_to(ROOT))
        for package in ("runner", "worker")
        for path in (ROOT / package).rglob("*.py")
        if DEVICE_CHECK.search(path.read_text())
    )
    assert found == ["runner/ops.py"]


@pytest.mark.timeout(120)
def test_cpu_path_does_not_import_triton():
    code = ("import sys, runner.model_runner, worker.worker\n"
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=110, check=True)
    assert out.stdout.strip() == "False"


def test_cpu_gets_the_torch_references_behind_their_checks():
    ops = device_ops(torch.device("cpu"))
    assert ops is device_ops(torch.device("cpu"))  # picked once per device
    assert ops.row_parallel_matmul is F.linear
    assert ops.prepare_prefill_inputs.__wrapped__ is prepare_prefill_inputs_ref
    idx = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="num_reqs"):
        ops.prepare_prefill_inputs(torch.zeros(4, dtype=torch.int32), idx,
                                   torch.zeros(3, dtype=torch.int32),
                                   torch.zeros(2, 4, dtype=torch.int32), idx, idx, 3)
