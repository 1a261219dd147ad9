"""Programmatic dependent launch (runner/triton_dependent_launch.py, runner.ops.launch_pdl).

On CUDA (compute capability 9.0 and up) a chain of the decode step's
kernels, each reading what the one before wrote, captured in a CUDA graph
with PDL, gives bit for bit what the same chain gives launched plainly; a
kernel that read its input before the previous one had finished would not.
"""

from __future__ import annotations

import pytest
import torch

from runner import ops


def test_never_on_cpu_and_off_when_disabled(monkeypatch):
    assert not ops.launch_pdl(torch.device("cpu"))
    monkeypatch.setattr(ops, "PDL_ENABLED", False)
    if torch.cuda.is_available():
        assert not ops.launch_pdl(torch.device("cuda"))


needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="needs a CUDA device of compute capability 9.0 or up")


def _chain(x, residual, norm_w, weights):
    """(add + RMSNorm -> skinny matmul) per weight, as the decoder's layers chain them."""
    from runner.layers.triton_rms_norm import fused_add_rms_norm_triton
    from runner.layers.triton_skinny_matmul import skinny_gate_up_silu, skinny_matmul

    h = x
    for w_up, w_down in weights:
        normed, residual = fused_add_rms_norm_triton(h, residual, norm_w, 1e-5)
        h = skinny_matmul(skinny_gate_up_silu(normed, w_up), w_down)
    return h, residual


@needs_hopper
def test_graph_with_pdl_equals_plain_launches(monkeypatch):
    torch.manual_seed(0)
    dev = torch.device("cuda")
    hidden, inter = 1024, 2048
    x = torch.randn(2, hidden, device=dev, dtype=torch.bfloat16)
    norm_w = torch.rand(hidden, device=dev, dtype=torch.bfloat16) + 0.5
    weights = [(torch.randn(2 * inter, hidden, device=dev, dtype=torch.bfloat16) / 32,
                torch.randn(hidden, inter, device=dev, dtype=torch.bfloat16) / 45)
               for _ in range(8)]
    monkeypatch.setattr(ops, "PDL_ENABLED", False)
    want, want_res = _chain(x, torch.zeros_like(x), norm_w, weights)

    monkeypatch.setattr(ops, "PDL_ENABLED", True)
    residual = torch.zeros_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: compiles the PDL variants
        _chain(x, residual.zero_(), norm_w, weights)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got, got_res = _chain(x, residual, norm_w, weights)
    for _ in range(20):
        residual.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want)
        assert torch.equal(got_res, want_res)
