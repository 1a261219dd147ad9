"""LoRA on the paths CUDA graphs replay (captured on CUDA, emulated on
CPU): a mixed-batch graph prefills and padded decode graphs decode requests
of two adapters and of none, each giving HF's greedy tokens of the model
with its adapter merged. The delta is the device's own ("own": CUDA's
Triton kernels, the CPU's torch masked form) and, on CPU, also CUDA's kernels under the
interpreter, which read each token's slot index (``token_slot``)."""

import dataclasses

import pytest
import torch

from ipc.messages import (
    CachedRequestData,
    LoRALoad,
    NewRequestData,
    SamplingOptions,
    SchedulerOutput,
)
from runner.lora import triton_lora
from runner.ops import triton_ops
from tests.helpers.devices import NEEDS_CUDA
from tests.helpers.lora_adapters import model_with_adapters
from tests.helpers.runner_steps import make_runner

PROMPTS = [[5, 17, 99, 3], list(range(1, 30)), [(7 * i) % 200 + 1 for i in range(20)]]
STEPS = 6


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device,delta", [
    ("cpu", "own"), pytest.param("cuda", "own", marks=NEEDS_CUDA), ("cpu", "triton"),
    pytest.param("cuda", "triton", marks=NEEDS_CUDA)])
def test_graph_paths_add_each_requests_adapter(tmp_path, device, delta, monkeypatch):
    # On CUDA the graphs are captured (decode 1, 2, 4, 8 rows; mixed 64, 128,
    # 256 tokens): each replay builds its tokens' adapter mask inside it.
    model_dir, paths, expected = model_with_adapters(tmp_path, PROMPTS, STEPS + 1)
    emulate = device == "cpu"
    runner = make_runner(model_dir, device, emulate_graphs=emulate,
                         emulate_prefill_graphs=emulate, enable_lora=True, max_loras=2,
                         max_lora_rank=16)
    if delta == "triton":  # runner/lora/triton_lora.py's kernels (interpreted on CPU)
        monkeypatch.setattr(triton_lora, "LORA_TRITON", True)
        monkeypatch.setattr(triton_lora, "LORA_TRITON_MAX_TOKENS", 1 << 30)
        kernel = triton_ops(torch.device(device)).lora_add_delta
        for stacks in runner.lora.layers:
            for _, stack in stacks.values():
                stack.ops = dataclasses.replace(stack.ops, lora_add_delta=kernel)
    replays = {"decode": 0, "prefill": 0}
    for name, graphs in (("decode", runner.graphs), ("prefill", runner.prefill_graphs)):
        def counted(key, replay=graphs.replay, name=name):
            replays[name] += 1
            return replay(key)
        graphs.replay = counted
    # Adapter 2 in slot 0, adapter 1 in slot 1; request r1 runs without one.
    adapters = [2, None, 1]
    slots = {2: 0, None: -1, 1: 1}
    ids = [f"r{i}" for i in range(len(PROMPTS))]
    new = [NewRequestData(req_id=r, prompt_token_ids=p, prefill_token_ids=p,
                          sampling=SamplingOptions(temperature=0.0),
                          block_ids=[list(range(4 * i, 4 * i + 4))], num_computed_tokens=0,
                          max_tokens=STEPS + 1, lora_slot=slots[a])
           for i, (r, p, a) in enumerate(zip(ids, PROMPTS, adapters))]
    loads = [LoRALoad(slot=0, lora_int_id=2, lora_path=paths[2]),
             LoRALoad(slot=1, lora_int_id=1, lora_path=paths[1])]
    runner.execute_model(SchedulerOutput(step_id=0, scheduled_new_reqs=new,
                                         num_scheduled_tokens=[len(p) for p in PROMPTS],
                                         lora_loads=loads))
    tokens = {r: row for r, row in zip(ids, runner.sample_tokens().get_output().rows())}
    for step in range(1, STEPS + 1):
        cached = CachedRequestData(req_ids=ids, new_block_ids=[None] * len(ids))
        runner.execute_model(SchedulerOutput(step_id=step, scheduled_cached_reqs=cached,
                                             num_scheduled_tokens=[1] * len(ids)))
        for r, row in zip(ids, runner.sample_tokens().get_output().rows()):
            tokens[r] += row
    assert replays == {"decode": STEPS, "prefill": 1}  # 3 rows padded to 4
    assert [tokens[r] for r in ids] == [expected[a][i] for i, a in enumerate(adapters)]
