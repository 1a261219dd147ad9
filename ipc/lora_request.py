"""``LoRARequest``: which LoRA adapter a request runs with (vLLM's names).

A Struct, so it crosses the engine endpoint inside ``GenerateRequest`` as it
is. ``lora_int_id`` (>= 1) identifies the adapter: two requests of one id
share its loaded weights, and one engine takes one adapter per id.
``lora_name`` keys its prefix-cache blocks (vLLM's rule: blocks computed
under one adapter are never reused under another or none). ``lora_path``:
a local directory in PEFT's format (``ipc.lora_adapter``).
"""

from __future__ import annotations

import msgspec

from ipc.errors import InvalidRequestError


class LoRARequest(msgspec.Struct, frozen=True):
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise InvalidRequestError(f"lora_name must be a non-empty string, got "
                                      f"{self.lora_name!r}", param="lora_request")
        if (not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool)
                or self.lora_int_id < 1):
            raise InvalidRequestError(f"lora_int_id must be an int >= 1, got "
                                      f"{self.lora_int_id!r}", param="lora_request")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise InvalidRequestError(f"lora_path must name the adapter's directory, got "
                                      f"{self.lora_path!r}", param="lora_request")
