"""Custom logits processors: the interface a user's processor implements,
with vLLM's names and meaning, and how a processor is named.

A processor is a class, constructed once per worker (every tensor-parallel
rank holds its own) as ``cls(config, device, is_pin_memory)`` with the
runner's ``RunnerConfig``. Each step, before sampling, the runner calls
``update_state(batch_update)`` (None where no request joined or left the
batch), then ``apply(logits)`` on the logits of the persistent batch:
``logits[i]`` is the request at index ``i``. An index is the request's
slot: it holds from the step the request is added (``BatchUpdate.added``)
until the step it leaves (``BatchUpdate.removed``), and a request never
moves (``moved`` is always empty). Rows of slots that hold no request, or
a request that samples nothing this step, are read by nobody.

Every rank runs the same processors on the same batch and must take the
same decisions (no randomness of its own, no state of the rank).

A processor is named by its qualified name, ``module:Class`` (vLLM's
form, where ``Class`` may be dotted for a nested class) or
``module.Class``. Workers receive names only, over the socket, and import
them; a class given as an object must therefore be importable by its name
(``qualified_name``). Worker daemons start without the caller's folder
on their import path, so each name travels with the folder its module was
imported from (``import_folder``), which a worker appends to its path.
"""

from __future__ import annotations

import importlib
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class MoveDirectionality(Enum):
    """vLLM's kinds of move inside the persistent batch. tprun's requests
    keep their index, so no update carries a move; the names are here so a
    processor written for vLLM imports and runs unchanged."""

    UNIDIRECTIONAL = auto()
    SWAP = auto()


# (index, sampling parameters, prompt token ids, output token ids)
AddedRequest = tuple[int, Any, "list[int] | None", "list[int]"]
RemovedRequest = int
MovedRequest = tuple[int, int, MoveDirectionality]


@dataclass(frozen=True)
class BatchUpdate:
    """What changed in the persistent batch since the last ``update_state``.

    ``batch_size``: the rows of the logits ``apply`` gets (the runner's
    number of slots). ``removed``: indices whose request left; an index
    that a new request took in the same update is listed in ``added``
    only (the new request replaces the old one there). ``added``: one
    ``(index, params, prompt_token_ids, output_token_ids)`` per new
    request; ``params`` is the request's ``ipc.messages.SamplingOptions``
    (the sampling fields the workers get, ``extra_args`` among them);
    ``output_token_ids`` are the tokens it generated before it was added
    (those before a preemption), a snapshot that does not grow as vLLM's
    list does: a rank has a step's tokens on the host only once their copy
    ends, on the output rank alone, after the next step's sampling is
    queued (README, "Custom logits processors"). ``moved``: always empty.
    Apply them in vLLM's order: removed, added, moved.
    """

    batch_size: int
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """The base class of a custom logits processor (vLLM's methods)."""

    @abstractmethod
    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        """``config``: the runner's ``ipc.config.RunnerConfig``;
        ``is_pin_memory``: whether pinned host memory is available."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed logits ([batch_size, vocab] float32): ``logits``
        changed in place, or a new tensor of the same shape."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True when ``apply`` never changes a row's argmax: a batch of
        greedy requests then skips the processor."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Called every step before ``apply``; ``batch_update`` is None
        where no request joined or left."""


class LogitsProcessorError(ValueError):
    """A processor name that does not resolve to a ``LogitsProcessor``
    subclass, or a class that cannot be named; its message names it."""


def split_name(name: str) -> tuple[str, str]:
    """``(module, qualname)`` of ``module:Qual.Name`` or ``module.Class``."""
    if ":" in name:
        module, _, qualname = name.partition(":")
    else:
        module, _, qualname = name.rpartition(".")
    if not module or not qualname:
        raise LogitsProcessorError(f"logits processor {name!r}: give 'module:Class' or "
                                   "'module.Class'")
    return module, qualname


def load_processor_class(name: str) -> type[LogitsProcessor]:
    """The ``LogitsProcessor`` subclass ``name`` names, imported;
    ``LogitsProcessorError`` naming it where it cannot be."""
    module_name, qualname = split_name(name)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:
        raise LogitsProcessorError(f"logits processor {name!r}: cannot import module "
                                   f"{module_name!r} ({type(e).__name__}: {e})") from None
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise LogitsProcessorError(f"logits processor {name!r}: module {module_name!r} "
                                       f"has no {qualname!r}")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, LogitsProcessor)):
        raise LogitsProcessorError(f"logits processor {name!r} is not a subclass of "
                                   "runner.sampling.logits_processor.LogitsProcessor")
    return obj


def import_folder(name: str) -> str | None:
    """The folder on this process's import path that the (imported) module
    of processor ``name`` came from: its top-level package's parent, or the
    module's own folder; None for a module not read from a file."""
    top = sys.modules.get(split_name(name)[0].partition(".")[0])
    file = getattr(top, "__file__", None)
    if file is None:
        return None
    folder = os.path.dirname(os.path.abspath(file))
    return os.path.dirname(folder) if hasattr(top, "__path__") else folder


def add_import_folders(folders: Sequence[str]) -> None:
    """Append ``folders`` to this process's import path where missing:
    after every entry it holds, so they never replace a module it finds."""
    for folder in folders:
        if folder not in sys.path:
            sys.path.append(folder)


def qualified_name(cls: Any) -> str:
    """``module:Qual.Name`` of a processor class given as an object, which
    the workers can import back to this very class; ``LogitsProcessorError``
    for a class defined in ``__main__`` or inside a function (a worker
    process cannot import it) or one its name does not lead back to."""
    if not isinstance(cls, type):
        raise LogitsProcessorError(f"logits processor {cls!r}: give a class or its qualified "
                                   "name ('module:Class')")
    name = f"{cls.__module__}:{cls.__qualname__}"
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise LogitsProcessorError(f"logits processor {name!r}: worker processes import "
                                   "processors by name, so define the class at the top level "
                                   "of an importable module, not in __main__ or a function")
    if load_processor_class(name) is not cls:
        raise LogitsProcessorError(f"logits processor {name!r}: that name imports another "
                                   "object than the class given")
    return name
