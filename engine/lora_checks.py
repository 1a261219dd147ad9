"""The engine's check of a request's LoRA adapter, where the request enters.

Run by ``LLMEngine.new_request`` before anything is queued, so every
failure is the request's (``InvalidRequestError``) and the engine goes on:
LoRA off, an id or a name that names another adapter than the one the
engine knows by it, or an adapter ``ipc.lora_adapter.read_adapter`` refuses (a missing
path, a rank above ``max_lora_rank``, modules it cannot serve). An adapter
that passed is remembered by its ``LoRARequest``, so it is read once.

Several threads check: the engine server's loop and its tokenizer threads
(as they make requests) and an HTTP front end loading an adapter at runtime
(``serving/http/lora_updates.py``). An adapter is read with no lock held,
so a slow read (a runtime load from a slow disk) holds up no other check,
the engine loop's included; what is known is looked up and recorded under
one lock, looked up again after the read, so two adapters of one name or
one id never both pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from engine.config import ConfigError
from ipc.config import LoRAConfig
from ipc.errors import InvalidRequestError
from ipc.lora_adapter import read_adapter
from ipc.lora_request import LoRARequest
from ipc.model_config import ModelConfig

logger = logging.getLogger(__name__)


class LoRAChecks:
    def __init__(self, config: LoRAConfig | None, model: ModelConfig) -> None:
        self.config, self.model = config, model
        self._checked: dict[int, LoRARequest] = {}  # lora_int_id -> the adapter it names
        self._ids: dict[str, int] = {}  # lora_name -> its lora_int_id
        self._lock = threading.Lock()

    def check(self, lora: LoRARequest | None) -> None:
        """Refuse a ``lora`` this engine cannot serve (module docstring)."""
        if lora is None:
            return
        if not isinstance(lora, LoRARequest):
            raise InvalidRequestError(f"lora_request must be a LoRARequest, got "
                                      f"{type(lora).__name__}", param="lora_request")
        if self.config is None:
            raise InvalidRequestError(
                f"LoRA adapter {lora.lora_name!r} requested, but LoRA is not enabled: start the "
                "engine with enable_lora=True (--enable-lora)", param="lora_request")
        with self._lock:
            if self._refuse_or_known(lora):
                return
        read_adapter(lora.lora_path, self.model, self.config.max_lora_rank)
        with self._lock:
            if self._refuse_or_known(lora):  # passed by another thread meanwhile
                return
            self._checked[lora.lora_int_id] = lora
            self._ids[lora.lora_name] = lora.lora_int_id

    def _refuse_or_known(self, lora: LoRARequest) -> bool:
        """True for an adapter that passed already; ``InvalidRequestError``
        for one whose id or name another adapter holds; False for one to
        read. Called with the lock held."""
        known = self._checked.get(lora.lora_int_id)
        if known == lora:
            return True
        if known is not None:
            raise InvalidRequestError(
                f"lora_int_id {lora.lora_int_id} names adapter {known.lora_name!r} "
                f"({known.lora_path}); give {lora.lora_name!r} an id of its own",
                param="lora_request")
        other = self._ids.get(lora.lora_name)
        if other is not None:  # the name keys prefix-cache blocks: one adapter a name
            raise InvalidRequestError(
                f"lora_name {lora.lora_name!r} names the adapter of lora_int_id {other} "
                f"({self._checked[other].lora_path}); give this adapter a name of its own",
                param="lora_request")
        return False


    def readable(self, lora: LoRARequest) -> bool:
        """Whether ``lora``, checked before, still passes ``read_adapter``
        (the workers read its files again each time it takes an adapter
        slot, and a read that fails there stops the engine); a failure is
        logged."""
        try:
            read_adapter(lora.lora_path, self.model, self.config.max_lora_rank)
        except InvalidRequestError as e:
            logger.warning("LoRA adapter %r can no longer be read (%s): its request ends "
                           "with finish reason 'error'", lora.lora_name, e)
            return False
        return True


def check_lora_modules(checks: LoRAChecks, modules: Iterable[LoRARequest]) -> None:
    """vLLM's ``--lora-modules``, each read once as the server starts:
    ``ConfigError`` naming the module and the reason for one the engine
    refuses, so a bad adapter stops the start."""
    for lora in modules:
        try:
            checks.check(lora)
        except InvalidRequestError as e:
            raise ConfigError(f"--lora-modules {lora.lora_name}: {e}") from None
