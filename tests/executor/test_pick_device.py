"""A worker's device: CUDA device ``local_rank`` of its host, and a rank past
the host's devices refused by name before it touches CUDA."""

import pytest
import torch

from worker.worker import pick_device


def test_a_rank_past_the_cuda_devices_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(RuntimeError, match="local rank 1 needs CUDA device 1; this machine has 1"):
        pick_device("cuda", 1, 2)


def test_cuda_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        pick_device("cuda", 0)
