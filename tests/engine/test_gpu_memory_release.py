"""On CUDA: three LLMs built and shut down in a row in one process all work,
and after each shutdown the process holds (allocated and reserved) within
1 GiB of what it held before the first. Each LLM takes most of the GPU for
its KV cache, so one that left its memory behind would also starve the next.
"""

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GIB = 1 << 30


@pytest.mark.timeout(900)
def test_three_llms_in_a_row_release_gpu_memory(tmp_path):
    from benchmarks.shapes import write_shape

    model_dir = write_shape("1b", str(tmp_path / "1b"), max_position_embeddings=4096)
    torch.cuda.init()
    torch.cuda.synchronize()
    allocated_before = torch.cuda.memory_allocated()
    reserved_before = torch.cuda.memory_reserved()
    prompts = [{"prompt_token_ids": list(range(100 + i, 164 + i))} for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outputs = []
    for _ in range(3):
        llm = LLM(model=model_dir, device="cuda", dtype="bfloat16", load_format="dummy",
                  executor="uni", max_num_seqs=16, max_model_len=1024,
                  gpu_memory_utilization=0.6)
        outputs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        held = torch.cuda.memory_reserved()
        llm.shutdown()  # ``llm`` stays referenced: shutdown alone must free
        assert held - reserved_before > 8 * GIB  # weights, KV cache and graphs
        assert torch.cuda.memory_allocated() - allocated_before < GIB
        assert torch.cuda.memory_reserved() - reserved_before < GIB
    assert outputs[0] == outputs[1] == outputs[2]
    assert all(len(tokens) == 16 for tokens in outputs[0])
