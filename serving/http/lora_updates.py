"""vLLM's runtime LoRA updates: ``POST /v1/load_lora_adapter`` {"lora_name",
"lora_path"} and ``POST /v1/unload_lora_adapter`` {"lora_name"} (its
``lora_int_id`` taken and not read, as in vLLM), served only when the
server was started with them on (``--allow-runtime-lora-updating``, or
vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); off, the routes do not exist
(404), as in vLLM.

The adapters served are ``ServerState.lora_modules``: those of
``--lora-modules`` and those loaded here alike, so either kind may be
unloaded. A load is checked as a ``--lora-modules`` entry is, by the
engine's own check (``engine.lora_checks``, run off the event loop), before
its name is listed or accepted; its failure is the request's (400; 404 for
a path that is no directory, vLLM's ``LoRAAdapterNotFoundError``). A
success is answered with vLLM's plain text (``Success: LoRA adapter 'NAME'
added successfully.``, ``... removed successfully.``).

An unload takes the name off at once: /v1/models no longer lists it, and a
request naming it gets the 404 of a model not served, a request that named
it and had not reached the engine yet too (``ServerState.lora_request``
checks again). Requests the engine holds already keep their adapter and
finish with it: the engine frees its slot, as any slot, for an adapter a
later request brings (``engine.lora_slots``).

Ids: the engine takes one adapter per ``lora_int_id`` and per ``lora_name``
for its life (its prefix cache keys blocks by the name, so a block
computed under one adapter never serves another). A new adapter therefore
takes an id never given before, and a name loaded again after an unload
takes its old id back when its path is the same; under another path the
engine refuses the name (400). vLLM's ``load_inplace`` (new weights under a
loaded name) is refused for the same reason, and so is a name loaded again
from its path once the files there have changed (``files_stamp``: an
adapter trained again into its folder): under its old id the engine would
keep serving the weights it read first.

Loads and unloads run one at a time (one lock), so two loads of one name
never both pass.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from ipc.errors import InvalidRequestError
from ipc.lora_adapter import CONFIG_FILE, WEIGHTS_FILE
from ipc.lora_request import LoRARequest

logger = logging.getLogger(__name__)

LOAD_ROUTE = "/v1/load_lora_adapter"
UNLOAD_ROUTE = "/v1/unload_lora_adapter"


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str
    lora_int_id: int | None = None


class UnknownLoRAAdapterError(InvalidRequestError):
    """An unload named no adapter this server serves (HTTP 404)."""


def files_stamp(path: str) -> tuple:
    """What tells the adapter files under ``path`` apart from others written
    there later: each file's device, inode, size and modification time (None
    for a file that is missing), read through any symlink."""
    stamps = []
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        try:
            st = os.stat(os.path.join(path, name))
        except (OSError, ValueError):  # ValueError: a NUL in the path
            stamps.append(None)
        else:
            stamps.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


class LoRAUpdates:
    """The load and unload of adapters into ``served`` (the server's
    ``lora_modules``, name -> ``LoRARequest``), each load checked by
    ``check`` (the engine's ``LoRAChecks.check``) and refused under one of
    ``base_names`` (the model's served names)."""

    def __init__(self, served: dict[str, LoRARequest], base_names: tuple[str, ...],
                 check: Callable[[LoRARequest], None]) -> None:
        self.served, self.base_names, self.check = served, base_names, check
        self.next_id = max((lora.lora_int_id for lora in served.values()), default=0) + 1
        self.unloaded: dict[str, LoRARequest] = {}  # name -> its adapter, last unloaded
        # name -> files_stamp of its adapter as it was loaded (served or unloaded)
        self.stamps = {name: files_stamp(lora.lora_path) for name, lora in served.items()}
        self.lock = asyncio.Lock()

    async def load(self, request: LoadLoRAAdapterRequest) -> Response:
        name, path = request.lora_name, request.lora_path
        if not name or not path:
            raise InvalidRequestError("give both lora_name and lora_path",
                                      param="lora_name" if not name else "lora_path")
        if request.load_inplace:
            raise InvalidRequestError(
                "load_inplace is not supported: an adapter's name keys its prefix-cache "
                "blocks, so a name keeps its weights; load them under a new name",
                param="load_inplace")
        if name in self.base_names:
            raise InvalidRequestError(f"{name!r} is a name of the base model; give the adapter "
                                      "a name of its own", param="lora_name")
        path = os.path.abspath(path)  # as --lora-modules takes it, from the server's directory
        async with self.lock:
            if name in self.served:
                raise InvalidRequestError(
                    f"the LoRA adapter {name!r} is loaded already (from "
                    f"{self.served[name].lora_path}); unload it first", param="lora_name")
            before = self.unloaded.get(name)
            if before is not None and before.lora_path == path:
                lora = before
            else:
                lora = LoRARequest(name, self.next_id, path)
            stamp = await asyncio.to_thread(self._checked_stamp, lora)
            if lora is before and stamp != self.stamps.get(name):
                raise InvalidRequestError(
                    f"the files in {path} changed since {name!r} was loaded from there; "
                    "a name keeps the weights it was first loaded with (its prefix-cache "
                    "blocks are keyed by it): load them under a new name", param="lora_path")
            if lora.lora_int_id == self.next_id:
                self.next_id += 1
            self.unloaded.pop(name, None)
            self.served[name] = lora
            self.stamps[name] = stamp
        logger.info("loaded LoRA adapter %r from %s", name, path)
        return Response(f"Success: LoRA adapter '{name}' added successfully.",
                        media_type="text/plain")

    def _checked_stamp(self, lora: LoRARequest) -> tuple:
        """``lora`` checked by the engine, and its files' stamp taken just
        before (a change after it shows at the next load of the name)."""
        stamp = files_stamp(lora.lora_path)
        self.check(lora)
        return stamp

    async def unload(self, request: UnloadLoRAAdapterRequest) -> Response:
        name = request.lora_name
        if not name:
            raise InvalidRequestError("give the lora_name of the adapter to unload",
                                      param="lora_name")
        async with self.lock:
            lora = self.served.pop(name, None)
            if lora is None:
                raise UnknownLoRAAdapterError(f"the LoRA adapter {name!r} is not loaded here",
                                              param="lora_name")
            self.unloaded[name] = lora
        logger.info("unloaded LoRA adapter %r", name)
        return Response(f"Success: LoRA adapter '{name}' removed successfully.",
                        media_type="text/plain")
