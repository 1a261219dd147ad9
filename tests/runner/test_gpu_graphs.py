"""On CUDA: decode steps replayed from CUDA graphs equal eager steps; the
captured sizes follow the settings (the ladder itself is checked on CPU)."""

import pytest
import torch

from runner.cuda_graphs import capture_sizes
from tests.helpers.runner_steps import make_runner
from tests.helpers.runner_steps import run_prefill_then_decode as _run


def test_capture_sizes_stop_at_every_limit():
    assert capture_sizes(256, 8192)[-4:] == [232, 240, 248, 256]
    assert capture_sizes(256, 8192, 20) == [1, 2, 4, 8, 16, 20]  # the cap itself is captured
    assert capture_sizes(6, 2048, 100) == [1, 2, 4, 6]
    assert capture_sizes(512, 100) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88,
                                       96, 100]


def _runner(model_dir, enforce_eager):
    return make_runner(model_dir, "cuda", enforce_eager=enforce_eager)


@pytest.mark.timeout(300)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_decode_equals_eager(tmp_path):
    from checkpoint.tiny_model import ensure_tiny_model

    model_dir = ensure_tiny_model(str(tmp_path))
    prompts = [list(range(1, 41)), list(range(50, 120)), [7, 8, 9, 10, 11]]
    graphs = _runner(model_dir, enforce_eager=False)
    assert graphs.graphs.graphs, "no CUDA graph was captured"
    got, seq_lens = _run(graphs, prompts, steps=12)
    want, _ = _run(_runner(model_dir, enforce_eager=True), prompts, steps=12)
    assert got == want
    # Decodes sort by slot order of arrival; each row's seq_len grows by one a step.
    for step, lens in enumerate(seq_lens, start=1):
        assert sorted(lens) == sorted(len(p) + step for p in prompts)


@pytest.mark.timeout(300)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_max_cudagraph_capture_size_bounds_the_graphs(tmp_path):
    """The setting travels EngineConfig -> RunnerConfig -> the runner's graphs;
    a batch above it runs eagerly and gives the same tokens."""
    from checkpoint.tiny_model import ensure_tiny_model

    model_dir = ensure_tiny_model(str(tmp_path))
    runner = make_runner(model_dir, "cuda", max_cudagraph_capture_size=2)
    assert sorted(runner.graphs.graphs) == [1, 2]
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]  # 3 decodes: above the cap, eager
    got, _ = _run(runner, prompts, steps=4)
    want, _ = _run(_runner(model_dir, enforce_eager=True), prompts, steps=4)
    assert got == want


@pytest.mark.timeout(300)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixed_batch_graphs_equal_eager(tmp_path):
    """Steps with prefills replay the mixed-batch graphs captured on CUDA
    (the Triton backend) and sample what eager steps sample."""
    from checkpoint.tiny_model import ensure_tiny_model
    from tests.helpers.runner_steps import run_mixed_steps

    model_dir = ensure_tiny_model(str(tmp_path))
    runner = _runner(model_dir, enforce_eager=False)
    assert runner.prefill_graphs.graphs, "no mixed-batch graph was captured"
    chosen = []
    replay = runner.prefill_graphs.replay
    runner.prefill_graphs.replay = lambda key: chosen.append(key) or replay(key)
    got = run_mixed_steps(runner)
    assert chosen == [64, 128]
    assert got == run_mixed_steps(_runner(model_dir, enforce_eager=True))
