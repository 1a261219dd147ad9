"""``LLM.shutdown()`` releases what the engine held, in process too.

On the CPU: after shutdown nothing refers to the model or the KV cache any
more (weak references die), a worker at TP=2 has left its process group,
and LLMs built and shut down one after another in one process all work.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from engine import LLM, SamplingParams
from tests.helpers.multi_rank import RankInfo, run_on_ranks

PROMPTS = [{"prompt_token_ids": [3, 14, 15, 92, 65]}, "hello world"]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
SMALL = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128,
             kv_cache_memory_bytes=4 << 20)


def runner_refs(llm: LLM) -> list[weakref.ref]:
    """Weak references to the in-process runner, its model, a weight and
    every KV cache tensor."""
    runner = llm.engine.executor.worker.runner
    return [weakref.ref(runner), weakref.ref(runner.model),
            weakref.ref(next(runner.model.parameters())),
            *(weakref.ref(t) for t in runner.kv_caches)]


@pytest.mark.timeout(120)
def test_shutdown_drops_model_and_kv_cache():
    llm = LLM(model="tiny", device="cpu", executor="uni", **SMALL)
    llm.generate(PROMPTS, PARAMS)
    refs = runner_refs(llm)
    assert all(r() is not None for r in refs)
    llm.shutdown()  # collects by itself: no gc.collect() here
    assert [r() is None for r in refs] == [True] * len(refs)


@pytest.mark.timeout(180)
def test_three_llms_in_a_row():
    outputs, all_refs = [], []
    for _ in range(3):
        with LLM(model="tiny", device="cpu", executor="uni", **SMALL) as llm:
            outputs.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)])
            refs = runner_refs(llm)
        assert all(r() is None for r in refs)
        all_refs += refs
    assert outputs[0] == outputs[1] == outputs[2]
    assert all(len(tokens) == 6 for tokens in outputs[0])
    gc.collect()
    assert all(r() is None for r in all_refs)


def load_and_shut_down(rank: RankInfo) -> dict[str, torch.Tensor]:
    """Rank function: a Worker on the harness's process group loads the tiny
    model and a KV cache, then shuts down. Reports whether the group is gone
    and the model and cache are unreachable."""
    import torch.distributed as dist

    from checkpoint.tiny_model import ensure_tiny_model
    from tests.helpers.checkpoints import runner_config
    from worker.env import TorchrunEnv
    from worker.worker import Worker

    worker = Worker(TorchrunEnv.from_environ(), "cpu")
    worker.load_model(runner_config(ensure_tiny_model(), max_num_seqs=4,
                                    max_num_batched_tokens=64, max_model_len=128))
    worker.init_kv_cache(8)
    size = worker.runner.tp.size
    refs = [weakref.ref(worker.runner.model), *map(weakref.ref, worker.runner.kv_caches)]
    worker.shutdown()
    return {"tp_size": torch.tensor(size), "group_left": torch.tensor(not dist.is_initialized()),
            "freed": torch.tensor([r() is None for r in refs])}


@pytest.mark.timeout(180)
def test_worker_shutdown_at_tp2_leaves_the_group_and_frees():
    from checkpoint.tiny_model import ensure_tiny_model

    ensure_tiny_model()  # written once, before two ranks race to write it
    for result in run_on_ranks(load_and_shut_down, 2, backend="gloo"):
        assert int(result["tp_size"]) == 2
        assert bool(result["group_left"])
        assert bool(result["freed"].all()) and len(result["freed"]) > 1
