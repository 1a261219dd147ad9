"""Sleep mode on CUDA, in process: sleeping gives the device back the bytes of
the weights and the KV cache (``torch.cuda.memory_allocated`` drops by at
least their sum), waking gives back the pinned host memory that held level
1's weights (not kept in torch's pinned-block cache), the CUDA graphs are
dropped and captured again on waking, and greedy tokens after each level
equal those before."""

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPTS = [{"prompt_token_ids": list(range(100 + i, 140 + i))} for i in range(3)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.mark.timeout(600)
def test_sleep_frees_device_memory_and_wakes_to_the_same_tokens(tmp_path):
    from benchmarks.shapes import write_shape

    model_dir = write_shape("1b", str(tmp_path / "1b"), max_position_embeddings=2048)
    with LLM(model=model_dir, device="cuda", dtype="bfloat16", load_format="dummy",
             executor="uni", max_num_seqs=8, max_model_len=1024,
             gpu_memory_utilization=0.5, enable_sleep_mode=True) as llm:
        runner = llm.engine.executor.worker.runner
        before = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
        held = runner.memory_bytes()
        assert runner.graphs.graphs  # decode graphs captured at start
        for level in (1, 2):
            torch.cuda.synchronize()
            awake = torch.cuda.memory_allocated()
            llm.sleep(level=level)
            assert runner.memory_bytes() == {"weights": 0, "kv_cache": 0}
            assert not runner.graphs.graphs
            assert awake - torch.cuda.memory_allocated() >= held["weights"] + held["kv_cache"]
            asleep_pinned = _pinned_host_bytes()
            llm.wake_up()
            assert runner.memory_bytes() == held
            if level == 1:  # the weights' host copies were pinned, and are not held after
                assert asleep_pinned - _pinned_host_bytes() >= held["weights"]
            assert runner.graphs.graphs  # captured again over the new addresses
            after = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
            assert after == before, f"level {level}"


def _pinned_host_bytes() -> int:
    """Pinned host memory torch's host allocator holds (in use or cached)."""
    return torch.cuda.host_memory_stats()["allocated_bytes.current"]
