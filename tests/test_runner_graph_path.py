"""The padded decode path that CUDA graphs replay, emulated on CPU: it must
give the tokens of eager steps, and a replay must read (never reset) the
inputs each step prepares."""

import pytest
import torch

from engine.tiny_model import ensure_tiny_model
from runner.cuda_graphs import CudaGraphManager
from tests.test_gpu_graphs import _run


def _runner(model_dir, graphs: bool):
    from runner.config import RunnerConfig
    from runner.distributed import TensorParallelGroup
    from runner.model_runner import ModelRunner

    config = RunnerConfig(model=model_dir, block_size=16, max_num_seqs=8,
                          max_num_batched_tokens=256, max_model_len=512)
    runner = ModelRunner(config, torch.device("cpu"), TensorParallelGroup.from_default_group())
    if graphs:
        runner.graphs = CudaGraphManager([1, 2, 4, 8], emulate=True)
    runner.init_kv_cache(128)
    return runner


@pytest.mark.timeout(120)
def test_padded_graph_path_equals_eager(tmp_path):
    model_dir = ensure_tiny_model(str(tmp_path))
    prompts = [list(range(1, 41)), list(range(50, 120)), [7, 8, 9, 10, 11]]
    graphs = _runner(model_dir, graphs=True)
    got, seq_lens = _run(graphs, prompts, steps=8)  # 3 requests padded to 4
    want, _ = _run(_runner(model_dir, graphs=False), prompts, steps=8)
    assert got == want
    for step, lens in enumerate(seq_lens, start=1):
        assert sorted(lens) == sorted(len(p) + step for p in prompts)


@pytest.mark.timeout(60)
def test_graph_forward_reads_but_never_writes_inputs(tmp_path):
    runner = _runner(ensure_tiny_model(str(tmp_path)), graphs=True)
    buf, tables = runner.buffers, runner.block_tables
    inputs = [buf.input_ids[:4], buf.positions[:4], buf.query_start_loc[:5], buf.seq_lens[:4],
              tables.batch_block_table[:4], tables.slot_mapping[:4]]
    buf.query_start_loc[:5] = torch.tensor([0, 1, 2, 3, 4])
    buf.seq_lens[:4] = torch.tensor([3, 5, 2, 1])
    buf.positions[:4] = torch.tensor([2, 4, 1, 0])
    tables.batch_block_table[:4, 0] = torch.tensor([3, 4, 5, 6])
    tables.slot_mapping[:4] = torch.tensor([50, 68, 81, 96])
    before = [t.clone() for t in inputs]
    runner._graph_forward(4)
    for old, new in zip(before, inputs):
        assert torch.equal(old, new)
