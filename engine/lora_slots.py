"""Which LoRA adapter each of the workers' adapter slots holds.

The scheduler owns it: ``max_loras`` slots, each empty or holding one
adapter (by ``lora_int_id``). A request with an adapter is admitted only
once its adapter has a slot: the slot it holds already, else an empty one,
else the least recently used slot whose adapter no running request uses,
which the step's plan reloads (``SchedulerOutput.lora_loads``). So the
distinct adapters of the running requests never exceed ``max_loras``
(vLLM's rule), and a slot is never reloaded under a running request (the
workers apply a plan only after the steps before it are queued, so no
step in flight reads a slot while it is written).
"""

from __future__ import annotations

from collections import OrderedDict

from ipc.lora_request import LoRARequest
from ipc.messages import LoRALoad


class LoRASlots:
    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        # lora_int_id -> slot, least recently used first.
        self._slots: OrderedDict[int, int] = OrderedDict()

    def slot_of(self, lora_int_id: int) -> int | None:
        return self._slots.get(lora_int_id)

    def _victim(self, in_use: set[int]) -> int | None:
        """The adapter whose slot a new one takes: None while a slot is
        empty; else the least recently used one not ``in_use``. Raises
        ``LookupError`` when every slot's adapter is in use."""
        if len(self._slots) < self.max_loras:
            return None
        for lora_int_id in self._slots:
            if lora_int_id not in in_use:
                return lora_int_id
        raise LookupError("every adapter slot is in use")

    def can_take(self, lora: LoRARequest, in_use: set[int]) -> bool:
        """Whether ``acquire`` would give ``lora`` a slot now (changes nothing)."""
        if lora.lora_int_id in self._slots:
            return True
        try:
            self._victim(in_use)
        except LookupError:
            return False
        return True

    def acquire(self, lora: LoRARequest, in_use: set[int]) -> tuple[int, LoRALoad | None]:
        """``lora``'s slot, marked most recently used, and the load that
        puts it there (None: it is there already); ``can_take`` must hold."""
        slot = self._slots.get(lora.lora_int_id)
        if slot is not None:
            self._slots.move_to_end(lora.lora_int_id)
            return slot, None
        victim = self._victim(in_use)
        slot = len(self._slots) if victim is None else self._slots.pop(victim)
        self._slots[lora.lora_int_id] = slot
        return slot, LoRALoad(slot=slot, lora_int_id=lora.lora_int_id, lora_path=lora.lora_path)
