"""Adapter slots (``LoRASlots``) and the plan check of LoRA fields, hand-worked."""

import msgspec
import pytest

from engine.lora_slots import LoRASlots
from ipc.config import LoRAConfig
from ipc.errors import InvalidPlanError
from ipc.lora_request import LoRARequest
from ipc.messages import LoRALoad, NewRequestData, SamplingOptions, SchedulerOutput
from runner.block_table import BlockTables
from runner.plan_check import check_plan
from runner.request_state import RequestState


def lora(i: int) -> LoRARequest:
    return LoRARequest(f"a{i}", i, f"/adapters/a{i}")


def test_slots_fill_then_reload_the_least_recently_used_adapter_not_in_use():
    slots = LoRASlots(2)
    assert slots.acquire(lora(1), set()) == (0, LoRALoad(slot=0, lora_int_id=1,
                                                          lora_path="/adapters/a1"))
    assert slots.acquire(lora(2), {1}) == (1, LoRALoad(slot=1, lora_int_id=2,
                                                        lora_path="/adapters/a2"))
    assert slots.acquire(lora(1), {1, 2}) == (0, None)  # held: no load; 2 is now the LRU
    assert not slots.can_take(lora(3), {1, 2})  # every adapter in use: 3 waits
    assert slots.can_take(lora(3), {1})
    assert slots.acquire(lora(3), {1}) == (1, LoRALoad(slot=1, lora_int_id=3,
                                                        lora_path="/adapters/a3"))
    assert slots.slot_of(2) is None and slots.slot_of(3) == 1
    # 1 was used before 3: the least recently used unused adapter is 1.
    assert slots.acquire(lora(2), set())[0] == 0


def _check(plan, lora_config):
    states, tables = RequestState(4, 32, "cpu"), BlockTables(4, 4, 8, 64, "cpu")
    return check_plan(plan, states, tables, 40, 64, 100, 0, lora_config)


@pytest.mark.parametrize("lora_config, slot, load, problem", [
    (None, 0, None, "LoRA slot 0 outside \\[-1, 0\\)"),
    (None, -1, 0, "LoRA load into slot 0 outside \\[0, 0\\)"),
    (LoRAConfig(max_loras=2, max_lora_rank=8), 2, None, "LoRA slot 2 outside \\[-1, 2\\)"),
    (LoRAConfig(max_loras=2, max_lora_rank=8), 1, -1, "load into slot -1"),
])
def test_plan_check_refuses_adapter_slots_outside_the_runners(lora_config, slot, load, problem):
    new = NewRequestData(req_id="r", prompt_token_ids=[1, 2], prefill_token_ids=[1, 2],
                         sampling=SamplingOptions(), block_ids=[[0]], num_computed_tokens=0,
                         max_tokens=4, lora_slot=slot)
    loads = [] if load is None else [LoRALoad(slot=load, lora_int_id=1, lora_path="/a")]
    plan = SchedulerOutput(step_id=3, scheduled_new_reqs=[new], num_scheduled_tokens=[2],
                           lora_loads=loads)
    with pytest.raises(InvalidPlanError, match=problem):
        _check(plan, lora_config)
    fine = msgspec.structs.replace(plan, scheduled_new_reqs=[
        msgspec.structs.replace(new, lora_slot=-1)], lora_loads=[])
    assert len(_check(fine, lora_config)) == 1
