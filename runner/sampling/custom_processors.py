"""The runner's custom logits processors (``runner.sampling.logits_processor``):
built once, told of each step's batch changes, applied in the sampler.

Indices are slots: a request's index is the slot it holds from the step it
is added to the step it leaves, so nothing ever moves. ``apply`` scatters
the batch's rows into a persistent ``[max_num_reqs, vocab]`` float32 table
at their slots, runs the processors on the table (the layout vLLM's
processors expect: row i is the request at index i) and gathers the rows
back in batch order. The table's rows of slots outside the batch hold
stale values that no one reads.

Processors that may change an argmax (``is_argmax_invariant()`` False) run
for every batch, after ``logit_bias``/``allowed_token_ids``, bad words and
``min_tokens`` and before the penalties, as vLLM runs them after its
built-in min-tokens and logit-bias processors; argmax-invariant ones run
only in a batch that samples at a temperature (a greedy batch skips them,
as vLLM's does), on the logits divided by each row's temperature (a greedy
row's by 1) after min-p and before top-k and top-p, as vLLM runs them after
its min-p processor.

``BatchUpdate.added``'s output tokens are a snapshot taken when the request
is added (its tokens before a preemption), not a list that grows: the
sampled tokens reach a rank's host only through the output rank's copy
thread (``runner.async_output``); see ``logits_processor.BatchUpdate``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ipc.config import RunnerConfig
from ipc.messages import NewRequestData
from runner.sampling.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    LogitsProcessorError,
    add_import_folders,
    load_processor_class,
)


def build_processors(config: RunnerConfig, device: torch.device,
                     is_pin_memory: bool) -> list[LogitsProcessor]:
    """One instance of each processor ``config.logits_processors`` names
    (``is_pin_memory``: host memory the device copies from is pinned, as the
    device seam's transfers pin it);
    ``LogitsProcessorError`` naming the one that fails to import or to
    construct. The folders the engine imported them from are appended to
    the import path first (a worker daemon starts without the caller's)."""
    add_import_folders(config.logits_processor_folders)
    processors = []
    for name in config.logits_processors:
        cls = load_processor_class(name)
        try:
            processors.append(cls(config, device, is_pin_memory))
        except Exception as e:
            raise LogitsProcessorError(f"logits processor {name!r} failed to construct: "
                                       f"{type(e).__name__}: {e}") from e
    return processors


class CustomLogitsProcessors:
    def __init__(self, processors: Sequence[LogitsProcessor], max_num_reqs: int,
                 vocab_size: int, device: torch.device):
        self.changing = [p for p in processors if not p.is_argmax_invariant()]
        self.invariant = [p for p in processors if p.is_argmax_invariant()]
        self.all = [*self.changing, *self.invariant]
        self.batch_size = max_num_reqs
        self.table = torch.zeros((max_num_reqs, vocab_size), dtype=torch.float32, device=device)
        self._removed: list[int] = []
        self._added: list = []

    @property
    def may_change_argmax(self) -> bool:
        """Whether a greedy row's token may differ from the model's argmax."""
        return bool(self.changing)

    def remove_request(self, slot: int) -> None:
        self._removed.append(slot)

    def add_request(self, slot: int, new: NewRequestData) -> None:
        """A new request at ``slot``; where a request left that slot in the
        same update, only the addition is reported (it replaces the old)."""
        if slot in self._removed:
            self._removed.remove(slot)
        outputs = list(new.prefill_token_ids[len(new.prompt_token_ids):])
        self._added.append((slot, new.sampling, list(new.prompt_token_ids), outputs))

    def update_state(self) -> None:
        """Each processor's ``update_state``, once a step, before sampling."""
        update = None
        if self._removed or self._added:
            update = BatchUpdate(batch_size=self.batch_size, removed=sorted(self._removed),
                                 added=self._added, moved=[])
            self._removed, self._added = [], []
        for p in self.all:
            p.update_state(update)

    def apply_changing(self, logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The batch's logits (rows at slots ``idx``) after the processors
        that may change an argmax, as a new float32 tensor."""
        return self._apply(self.changing, logits, idx)

    def apply_invariant(self, logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """As ``apply_changing``, for the argmax-invariant processors."""
        return self._apply(self.invariant, logits, idx)

    def _apply(self, processors: list[LogitsProcessor], logits: torch.Tensor,
               idx: torch.Tensor) -> torch.Tensor:
        if not processors:
            return logits
        table = self.table
        table.index_copy_(0, idx, logits.to(torch.float32))
        for p in processors:
            table = p.apply(table)
        return table.index_select(0, idx)
