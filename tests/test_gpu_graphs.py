"""On CUDA: decode steps replayed from CUDA graphs equal eager steps."""

import pytest
import torch

from tests.runner_steps import run_prefill_then_decode as _run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _runner(model_dir, enforce_eager):
    from runner.config import RunnerConfig
    from runner.distributed import TensorParallelGroup
    from runner.model_runner import ModelRunner

    config = RunnerConfig(model=model_dir, device="cuda", block_size=16, max_num_seqs=8,
                          max_num_batched_tokens=256, max_model_len=512,
                          enforce_eager=enforce_eager)
    runner = ModelRunner(config, torch.device("cuda", 0), TensorParallelGroup.from_default_group())
    runner.init_kv_cache(128)
    return runner


@pytest.mark.timeout(300)
def test_graph_decode_equals_eager(tmp_path):
    from engine.tiny_model import ensure_tiny_model

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
