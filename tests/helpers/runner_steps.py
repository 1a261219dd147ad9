"""Driving a ModelRunner directly with hand-made plans (runner tests)."""

import torch

from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
from tests.helpers.checkpoints import runner_config


def make_runner(model_dir: str, device: str = "cpu", num_blocks: int = 128,
                emulate_graphs: bool = False, emulate_prefill_graphs: bool = False, **config):
    """A ModelRunner of ``model_dir`` on ``device`` with a KV cache of
    ``num_blocks`` blocks; RunnerConfig fields in ``config`` override the
    test's settings (block size 16, 8 sequences, 256 batched tokens, length
    512); the rest are EngineConfig's defaults.
    ``emulate_graphs`` replays the padded decode path eagerly (sizes 1-8),
    so CPU tests reach what CUDA graphs run; ``emulate_prefill_graphs``
    does the same for the mixed-batch graphs (64 and 128 tokens)."""
    from runner.cuda_graphs import CudaGraphManager
    from runner.distributed import TensorParallelGroup
    from runner.model_runner import ModelRunner

    settings = dict(block_size=16, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512)
    settings.update(config)
    runner = ModelRunner(runner_config(model_dir, device=device, **settings),
                         torch.device("cuda", 0) if device == "cuda" else torch.device(device),
                         TensorParallelGroup.from_default_group())
    if emulate_graphs:
        runner.graphs = CudaGraphManager([1, 2, 4, 8], emulate=True)
    if emulate_prefill_graphs:
        runner.prefill_graphs = CudaGraphManager([64, 128], emulate=True)
    runner.init_kv_cache(num_blocks)
    return runner


def decode_step(runner, step_id, req_ids, constrained=()):
    """Queue one decode step of ``req_ids``, one token each; ``constrained``:
    those of them whose step awaits a grammar bitmask."""
    cached = CachedRequestData(req_ids=list(req_ids), new_block_ids=[None for _ in req_ids])
    runner.execute_model(SchedulerOutput(
        step_id=step_id, scheduled_cached_reqs=cached, num_scheduled_tokens=[1] * len(req_ids),
        structured_output_req_ids=list(constrained)))


def run_prefill_then_decode(runner, prompts, steps, sampling=None):
    """Prefill every prompt in one step, then decode ``steps`` steps; returns
    the tokens and the seq_lens the device held at each decode step.
    ``sampling``: each prompt's SamplingOptions (None: greedy for all)."""
    ids = [f"r{i}" for i in range(len(prompts))]
    blocks, start = [], 0
    for p in prompts:
        n = -(-(len(p) + steps + 1) // 16)
        blocks.append(list(range(start, start + n)))
        start += n
    if sampling is None:
        sampling = [SamplingOptions(temperature=0.0)] * len(prompts)
    new = [NewRequestData(req_id=r, prompt_token_ids=p, prefill_token_ids=p,
                          sampling=o, block_ids=[b], num_computed_tokens=0,
                          max_tokens=steps + 1)
           for r, p, b, o in zip(ids, prompts, blocks, sampling, strict=True)]
    runner.execute_model(SchedulerOutput(
        step_id=0, scheduled_new_reqs=new, num_scheduled_tokens=[len(p) for p in prompts]))
    out = runner.sample_tokens().get_output()
    tokens = dict(zip(ids, out.rows()))  # reply rows follow the plan's order
    seq_lens = []
    for step in range(1, steps + 1):
        decode_step(runner, step, ids)
        out = runner.sample_tokens().get_output()
        seq_lens.append(runner.buffers.seq_lens[: len(ids)].tolist())
        for r, t in zip(ids, out.rows()):
            tokens[r] += t
    return tokens, seq_lens


def run_mixed_steps(runner):
    """Step 0 prefills r0 and r1; step 1 decodes them beside r2's prefill (a
    mixed batch); step 2 decodes all three. Returns each step's tokens in
    plan order, and the rows of the mixed step."""
    def new(req_id, prompt, first_block):
        return NewRequestData(req_id=req_id, prompt_token_ids=prompt, prefill_token_ids=prompt,
                              sampling=SamplingOptions(temperature=0.0),
                              block_ids=[list(range(first_block, first_block + 8))],
                              num_computed_tokens=0, max_tokens=8)

    p0, p1, p2 = list(range(3, 40)), list(range(60, 65)), list(range(100, 190))
    runner.execute_model(SchedulerOutput(step_id=0, scheduled_new_reqs=[new("r0", p0, 0),
                                                                        new("r1", p1, 8)],
                                         num_scheduled_tokens=[len(p0), len(p1)]))
    outs = [runner.sample_tokens().get_output().rows()]
    cached = CachedRequestData(req_ids=["r0", "r1"], new_block_ids=[None, None])
    runner.execute_model(SchedulerOutput(step_id=1, scheduled_new_reqs=[new("r2", p2, 16)],
                                         scheduled_cached_reqs=cached,
                                         num_scheduled_tokens=[1, 1, len(p2)]))
    outs.append(runner.sample_tokens().get_output().rows())
    cached = CachedRequestData(req_ids=["r0", "r1", "r2"], new_block_ids=[None, None, None])
    runner.execute_model(SchedulerOutput(step_id=2, scheduled_cached_reqs=cached,
                                         num_scheduled_tokens=[1, 1, 1]))
    outs.append(runner.sample_tokens().get_output().rows())
    return outs
