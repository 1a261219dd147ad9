"""The devices a test runs on: the CPU everywhere, CUDA where there is a
GPU. A CUDA variant's id holds "cuda", so ``pytest -k cuda`` selects the
CUDA variants alone (``benchmarks/run_h200.sh gpu-tests``)."""

import pytest
import torch

# The marks of a CUDA variant: a GPU test, skipped on a machine without one.
NEEDS_CUDA = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# ``@pytest.mark.parametrize("device", DEVICES)``: ids "cpu" and "cuda".
DEVICES = ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)]
