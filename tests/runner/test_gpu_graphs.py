"""On CUDA: decode steps replayed from CUDA graphs equal eager steps."""

import pytest
import torch

from tests.helpers.runner_steps import make_runner
from tests.helpers.runner_steps import run_prefill_then_decode as _run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _runner(model_dir, enforce_eager):
    return make_runner(model_dir, "cuda", enforce_eager=enforce_eager)


@pytest.mark.timeout(300)
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
