"""On CUDA: decode steps replayed from CUDA graphs equal eager steps."""

import pytest
import torch

from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput

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


def _run(runner, prompts, steps):
    """Prefill every prompt in one step, then decode ``steps`` steps; returns
    the tokens and the seq_lens the device held at each decode step."""
    ids = [f"r{i}" for i in range(len(prompts))]
    blocks, start = [], 0
    for p in prompts:
        n = -(-(len(p) + steps + 1) // 16)
        blocks.append(list(range(start, start + n)))
        start += n
    new = [NewRequestData(req_id=r, prompt_token_ids=p, prefill_token_ids=p,
                          sampling=SamplingOptions(temperature=0.0), block_ids=[b],
                          num_computed_tokens=0, max_tokens=steps + 1)
           for r, p, b in zip(ids, prompts, blocks)]
    runner.execute_model(SchedulerOutput(
        step_id=0, scheduled_new_reqs=new, num_scheduled_tokens={r: len(p) for r, p in
                                                                 zip(ids, prompts)},
        total_num_scheduled_tokens=sum(map(len, prompts))))
    out = runner.sample_tokens().get_output()
    tokens = {r: list(t) for r, t in zip(out.req_ids, out.sampled_token_ids)}
    computed = {r: len(p) for r, p in zip(ids, prompts)}
    seq_lens = []
    for step in range(1, steps + 1):
        cached = CachedRequestData(req_ids=ids, new_block_ids=[[[]] for _ in ids],
                                   num_computed_tokens=[computed[r] for r in ids])
        runner.execute_model(SchedulerOutput(
            step_id=step, scheduled_cached_reqs=cached, num_scheduled_tokens=dict.fromkeys(ids, 1),
            total_num_scheduled_tokens=len(ids)))
        out = runner.sample_tokens().get_output()
        seq_lens.append(runner.buffers.seq_lens[: len(ids)].tolist())
        for r, t in zip(out.req_ids, out.sampled_token_ids):
            tokens[r] += t
            computed[r] += 1
    return tokens, seq_lens


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
