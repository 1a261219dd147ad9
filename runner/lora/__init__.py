"""LoRA serving in the runner: stacked adapter factors per projection
(``stack``) and the adapter slots with their per-token mask (``adapters``)."""

from runner.lora.adapters import LoRAAdapters
from runner.lora.stack import LoRAStack

__all__ = ["LoRAAdapters", "LoRAStack"]
