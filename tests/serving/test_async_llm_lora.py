"""``AsyncLLM.generate(..., lora_request=...)``: the adapter crosses the engine
endpoint inside ``GenerateRequest`` and each request gets HF's greedy tokens
of the model with its adapter merged; an adapter the engine cannot serve is
the request's ``InvalidRequestError``."""

import asyncio

import pytest

from engine import LoRARequest, SamplingParams
from ipc.errors import InvalidRequestError
from serving.async_llm import AsyncLLM
from tests.helpers.lora_adapters import model_with_adapter_requests

PROMPTS = [[5, 17, 99, 3], list(range(1, 30))]
MAX_TOKENS = 6
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


async def _final(llm, prompt, request_id, lora):
    return [out async for out in llm.generate({"prompt_token_ids": prompt}, PARAMS, request_id,
                                              lora_request=lora)][-1]


@pytest.mark.timeout(180)
def test_async_generate_runs_each_requests_adapter(tmp_path):
    model_dir, loras, expected = model_with_adapter_requests(tmp_path, PROMPTS, MAX_TOKENS)
    cases = [(lora_id, i) for lora_id in (1, None, 3) for i in range(len(PROMPTS))]
    llm = AsyncLLM(model=model_dir, device="cpu", enable_lora=True, max_loras=2)
    try:
        async def all_cases():
            return await asyncio.gather(*(_final(llm, PROMPTS[i], f"r{n}", loras.get(lora_id))
                                          for n, (lora_id, i) in enumerate(cases)))

        outs = asyncio.run(asyncio.wait_for(all_cases(), 60))
        assert [o.outputs[0].token_ids for o in outs] == [expected[lora_id][i]
                                                          for lora_id, i in cases]
        bad = LoRARequest("missing", 9, str(tmp_path / "missing"))
        with pytest.raises(InvalidRequestError, match="no such directory"):
            asyncio.run(asyncio.wait_for(_final(llm, PROMPTS[0], "bad", bad), 60))
    finally:
        llm.shutdown()
