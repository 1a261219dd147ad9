"""Per-slot sampling parameters: device tables written by staged writes, host mirrors.

Every slot's float parameters sit in one row of a [max_num_reqs, 6] float32
table (columns below), so one staged write adds a request. ``top_k`` (int32)
and ``seed`` (int64) have their own tables. The draw, the filters and the
penalties read a row's values at its slot in these tables (``slot_*``: the
float table's columns), never a gather of the batch. The host mirrors
(``*_np``) hold the same values; the sampler reads them to skip work no row
of a batch needs, never the device tables.

Invariants:
- A greedy slot (temperature 0; below GREEDY_EPS reads as greedy too, as
  in vLLM's sampler, though the engine sends none: ``SamplingParams``
  raises a temperature in (0, 0.01) to 0.01) stores top_k 0, top_p 1 and
  min_p 0: its filters are off, so they never make a batch run a filter.
  Its penalties stay: greedy picks the argmax of the penalised logits.
- ``num_logprobs_np[slot]`` is -1 when the request asked for no logprobs,
  int32's largest when it asked for the whole vocabulary (``WHOLE_VOCAB``),
  the number of its ``logprob_token_ids`` where it gave those.
- ``needs_np[slot]`` holds the slot's ``NEEDS_*`` bits, derived from the
  same host values that ``flags`` reads: a batch whose slots have none is
  plain (greedy, no penalty, filter or logprobs), known from one OR over
  the batch; ``num_needing`` counts the slots with any bit (freed slots
  keep theirs until reused, so it only ever overcounts).
- Unseeded requests get a seed from the sampler's own generator when they
  are added; every rank adds the same requests in the same order, so every
  rank draws the same seeds.
- A seed is stored as it is, any signed 64-bit value (``SamplingParams``'
  range): the noise hash reads its 64 bits (``noise.py``), so two different
  seeds are two different keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ipc.messages import WHOLE_VOCAB, SamplingOptions
from runner.staged_write import StagedWriteTensor

GREEDY_EPS = 1e-5
NO_LOGPROBS = -1

# Columns of the float table.
TEMPERATURE, TOP_P, MIN_P, REPETITION, PRESENCE, FREQUENCY = range(6)
_NUM_FLOATS = 6
# Bits of ``needs_np``: what a slot's request asks of the sampler.
NEEDS_SAMPLING, NEEDS_PENALTY, NEEDS_MIN_P, NEEDS_TOP_P, NEEDS_TOP_K, NEEDS_LOGPROBS = (
    1 << i for i in range(6))
SEEDS_AHEAD = 64
_INT32_MAX = (1 << 31) - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class BatchFlags:
    """What a batch needs, from the host mirrors (no device read)."""

    all_greedy: bool
    any_penalty: bool
    any_min_p: bool
    any_top_p: bool
    max_top_k: int  # 0: no row uses top-k
    max_logprobs: int  # NO_LOGPROBS: no row asked


class SamplingStates:
    def __init__(self, max_num_reqs: int, device: torch.device, seed: int):
        self.floats = StagedWriteTensor((max_num_reqs, _NUM_FLOATS), torch.float32, device)
        self.top_k = StagedWriteTensor((max_num_reqs,), torch.int32, device)
        self.seeds = StagedWriteTensor((max_num_reqs,), torch.int64, device)
        # The kernels read a row's parameters at its slot: the float table's
        # columns, not a gather.
        self.slot_temperature = self.floats.gpu[:, TEMPERATURE]
        self.slot_top_p = self.floats.gpu[:, TOP_P]
        self.slot_min_p = self.floats.gpu[:, MIN_P]
        # [max_num_reqs, 3]: repetition, presence, frequency (adjacent columns).
        self.slot_penalties = self.floats.gpu[:, REPETITION:FREQUENCY + 1]
        self.floats_np = np.zeros((max_num_reqs, _NUM_FLOATS), dtype=np.float32)
        self.floats_np[:, REPETITION] = 1.0
        self.top_k_np = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_logprobs_np = np.full(max_num_reqs, NO_LOGPROBS, dtype=np.int32)
        self.needs_np = np.zeros(max_num_reqs, dtype=np.uint8)
        self.num_needing = 0
        self.rng = np.random.default_rng(seed)
        self._seeds_left: list[int] = []  # drawn ahead, next one last

    def _next_seed(self) -> int:
        """The seed of the next unseeded request: the generator's next draw.
        Drawn ``SEEDS_AHEAD`` at a time (one call costs about as much as
        one draw); numpy's bounded draws of int64 give the same numbers
        drawn one by one or as an array, so the seeds do not change."""
        if not self._seeds_left:
            self._seeds_left = self.rng.integers(0, 2**62, size=SEEDS_AHEAD).tolist()[::-1]
        return self._seeds_left.pop()

    def add_request(self, slot: int, options: SamplingOptions) -> None:
        """Stage the slot's parameters (``staged_tensors``: the runner's
        StagedWriteGroup applies them);
        ``plan_check`` has refused options out of range (``problems``)."""
        row = _float_row(options)
        greedy = row[TEMPERATURE] == 0.0
        # A top_k beyond the vocabulary keeps every value, as does one beyond
        # int32 (the table's type): the filter clamps k to the row's width.
        top_k = 0 if greedy else min(max(options.top_k, 0), _INT32_MAX)
        seed = options.seed if options.seed is not None else self._next_seed()
        self.floats_np[slot] = row
        self.top_k_np[slot] = top_k
        ids = options.logprob_token_ids
        self.num_logprobs_np[slot] = _num_logprobs(
            options.logprobs if options.logprobs is not None or not ids else len(ids))
        needs = _needs(row, top_k, int(self.num_logprobs_np[slot]))
        self.num_needing += bool(needs) - bool(self.needs_np[slot])
        self.needs_np[slot] = needs
        self.floats.stage_write(slot, 0, row)
        self.top_k.stage_write_elem(slot, top_k)
        self.seeds.stage_write_elem(slot, seed)

    def unit_temperature(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-slot temperature, top-p and min-p on the device, as the
        ``slot_*`` columns are, but with every temperature 1 save a greedy
        slot's 0: what the filters and the draw read for rows already divided
        by their own temperature. Columns of one copy of the float table (the
        kernels read the three with one stride); a few device ops, no host
        read."""
        table = self.floats.gpu.clone()
        table[:, TEMPERATURE] = (table[:, TEMPERATURE] != 0.0).to(torch.float32)
        return table[:, TEMPERATURE], table[:, TOP_P], table[:, MIN_P]

    def uses_penalty(self, slot: int) -> bool:
        return bool(self.needs_np[slot] & NEEDS_PENALTY)

    @property
    def staged_tensors(self) -> tuple[StagedWriteTensor, ...]:
        """The tensors whose writes are staged on the host."""
        return (self.floats, self.top_k, self.seeds)

    def flags(self, idx_mapping_np: np.ndarray) -> BatchFlags:
        """What the batch's slots need, from the host mirrors: one OR of
        their ``needs_np`` bits, and a maximum only where a bit says some
        slot has a value above the default."""
        if self.num_needing == 0 or len(idx_mapping_np) == 0:
            return PLAIN
        needs = int(np.bitwise_or.reduce(self.needs_np[idx_mapping_np]))
        if needs == 0:
            return PLAIN
        return BatchFlags(
            all_greedy=not needs & NEEDS_SAMPLING,
            any_penalty=bool(needs & NEEDS_PENALTY),
            any_min_p=bool(needs & NEEDS_MIN_P),
            any_top_p=bool(needs & NEEDS_TOP_P),
            max_top_k=int(self.top_k_np[idx_mapping_np].max()) if needs & NEEDS_TOP_K else 0,
            max_logprobs=(int(self.num_logprobs_np[idx_mapping_np].max())
                          if needs & NEEDS_LOGPROBS else NO_LOGPROBS),
        )


PLAIN = BatchFlags(all_greedy=True, any_penalty=False, any_min_p=False, any_top_p=False,
                   max_top_k=0, max_logprobs=NO_LOGPROBS)


def _num_logprobs(asked: int | None) -> int:
    """A slot's ``num_logprobs_np`` value: NO_LOGPROBS for None, else the
    count, where the whole vocabulary (``WHOLE_VOCAB``) and any count past
    int32 (the table's type) are int32's largest: the logprobs clamp k to
    the row's width, so it means every token."""
    if asked is None:
        return NO_LOGPROBS
    return _INT32_MAX if asked == WHOLE_VOCAB else min(asked, _INT32_MAX)


def _needs(row: np.ndarray, top_k: int, num_logprobs: int) -> int:
    """The ``NEEDS_*`` bits of a slot with float row ``row``."""
    needs = 0
    if row[TEMPERATURE] != 0.0:
        needs |= NEEDS_SAMPLING
    if row[REPETITION] != 1.0 or row[PRESENCE] != 0.0 or row[FREQUENCY] != 0.0:
        needs |= NEEDS_PENALTY
    if row[MIN_P] > 0.0:
        needs |= NEEDS_MIN_P
    if row[TOP_P] < 1.0:
        needs |= NEEDS_TOP_P
    if top_k > 0:
        needs |= NEEDS_TOP_K
    if num_logprobs > NO_LOGPROBS:
        needs |= NEEDS_LOGPROBS
    return needs


def _float_row(options: SamplingOptions) -> np.ndarray:
    """The float table row of one request (columns in their order); greedy
    rows have their filters off."""
    if options.temperature < GREEDY_EPS:
        values = [0.0, 1.0, 0.0]
    else:
        values = [options.temperature, options.top_p, options.min_p]
    values += (options.repetition_penalty, options.presence_penalty, options.frequency_penalty)
    if max(map(abs, values)) <= _FLOAT32_MAX:
        return np.array(values, dtype=np.float32)
    # A value beyond float32 becomes inf, which still means what it says (an
    # infinite temperature samples uniformly): no warning for it.
    with np.errstate(over="ignore"):
        return np.array(values, dtype=np.float32)
