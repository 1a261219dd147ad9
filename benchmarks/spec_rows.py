"""bench_decode's speculative rows (``--spec-tokens K ...``): the decode step
with 1 + k query tokens a request against the plain step, in the same run.

A runner with ``num_speculative_tokens`` k decodes every request with k
drafts each step (the driver schedules 1 + k tokens, as the scheduler
does). Its step time against the plain runner's at the same (batch,
context) is the verify cost; the tokens a step emits (1 + accepted drafts
a request) give the speed at the acceptance measured.

Drafts come from the runner's n-gram proposer (``--spec-proposer ngram``:
with random weights the acceptance is whatever the model makes) or from
the replay proposer below (``replay``), which drafts the tokens a plain
greedy run of the same requests produced, a chosen fraction of them
corrupted, so the speed is measured at a known acceptance. Both runners
use the same random weights (same seed) and start every row from a zeroed
KV cache, so the plain run's tokens are the ones the spec run verifies
(bfloat16 may still break a near tie differently with 1 + k query tokens:
the acceptance is measured, not assumed).
"""

from __future__ import annotations

import dataclasses
import time

import msgspec
import numpy as np
import torch

from ipc.config import SpeculativeConfig
from ipc.messages import CachedRequestData, SchedulerOutput
from runner.model_runner import ModelRunner


class SpecDecodeDriver:
    """Feeds a speculative runner N requests decoding 1 + k tokens a step.

    The host's count of computed tokens advances by 1 + k a step (every
    draft counted as accepted) and is never corrected, so it is an upper
    bound of the runner's device count (the truth) that drifts further than
    the scheduler's would; the blocks given cover it."""

    def __init__(self, plain_driver_cls, runner: ModelRunner, k: int):
        self.inner = plain_driver_cls(runner)
        self.runner, self.k = runner, k
        self.emitted = 0
        self.rows = 0

    def start(self, batch: int, context: int, max_steps: int) -> None:
        self.inner.start(batch, context, max_steps * (1 + self.k))

    def step_plan(self) -> SchedulerOutput:
        inner = self.inner
        ids = list(inner.computed)
        if inner.pending_new:
            return inner.step_plan()  # the first step: prefill's last token, no drafts yet
        q = 1 + self.k
        cached = CachedRequestData(req_ids=ids, new_block_ids=[None for _ in ids],
                                   num_computed_tokens=[inner.computed[r] for r in ids])
        plan = inner._plan(scheduled_cached_reqs=cached, num_scheduled_tokens=[q] * len(ids))
        for r in ids:
            inner.computed[r] += q
        return plan

    def run(self, steps: int) -> float:
        """``steps`` steps, one in flight; seconds per step. Counts the
        tokens emitted (``emitted`` over ``rows`` request-steps)."""
        in_flight = None
        start = time.perf_counter()
        for _ in range(steps):
            self.runner.execute_model(self.step_plan())
            output = self.runner.sample_tokens()
            if in_flight is not None:
                self._count(in_flight.get_output())
            in_flight = output
        self._count(in_flight.get_output())
        return (time.perf_counter() - start) / steps

    def _count(self, out) -> None:
        rows = out.rows()
        self.emitted += sum(map(len, rows))
        self.rows += len(rows)

    def finish(self) -> None:
        self.inner.finish()


def spec_runner(plain: ModelRunner, k: int, device: torch.device, tp) -> ModelRunner:
    """A runner like ``plain`` (same config, same random weights) with k
    n-gram drafts a step."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_max=4,
                             prompt_lookup_min=2)
    config = msgspec.structs.replace(plain.config, speculative=spec)
    return ModelRunner(config, device, tp)


def zero_kv(runner: ModelRunner) -> None:
    for cache in runner.kv_caches:
        cache.zero_()


def random_kv(runner: ModelRunner, seed: int) -> None:
    """Every KV cache filled with standard normal values from ``seed``."""
    generator = torch.Generator(runner.device).manual_seed(seed)
    for cache in runner.kv_caches:
        cache.normal_(generator=generator)


def row_tokens(driver, runner: ModelRunner, batch: int, context: int, steps: int,
               kv_seed: int | None = None) -> list:
    """The tokens that ``batch`` requests of ``driver`` draw without drafts
    (greedy unless the driver samples), positions ``context`` .. ``context +
    steps - 1`` (one list per request), from a zeroed cache or, with
    ``kv_seed``, one of random values (``random_kv``)."""
    if kv_seed is None:
        zero_kv(runner)
    else:
        random_kv(runner, kv_seed)
    driver.start(batch, context, steps + 2)
    tokens = [[] for _ in range(batch)]
    for _ in range(steps):
        runner.execute_model(driver.step_plan())
        for i, row in enumerate(runner.sample_tokens().get_output().rows()):
            tokens[i] += row
    driver.finish()
    return tokens


def install_replay(runner: ModelRunner, tokens: list[list[int]], context: int,
                   accept: float, seed: int = 0) -> None:
    """Replace the runner's proposer: drafts are the replayed tokens at the
    positions after each request's last sampled one, each kept with
    probability ``accept`` (else replaced by another token). Requests are
    r0, r1, ... in order; the table is laid out by slot at the first call
    (the first step's sampling: every request is added by then)."""
    states, device = runner.req_states, runner.device
    vocab = runner.model.config.vocab_size
    cache: dict[str, torch.Tensor] = {}

    def table() -> torch.Tensor:
        if "table" not in cache:
            width = states.all_token_ids.gpu.shape[1] + 64
            full = torch.zeros(states.max_num_reqs + 1, width, dtype=torch.int64)
            for i, row in enumerate(tokens):
                full[states.req_id_to_index[f"r{i}"], context: context + len(row)] = (
                    torch.tensor(row))
            keep = torch.from_numpy(np.random.default_rng(seed).random(full.shape) < accept)
            cache["table"] = torch.where(keep, full, (full + 1) % vocab).to(device)
        return cache["table"]

    def propose(all_token_ids, idx_mapping, num_computed, draft_tokens, num_reqs, lo, hi):
        replay = table()
        slots = idx_mapping[:num_reqs].long()
        k = draft_tokens.shape[1]
        cols = num_computed[slots].long()[:, None] + 1 + torch.arange(k, device=slots.device)
        draft_tokens[slots] = replay[slots[:, None], cols.clamp(max=replay.shape[1] - 1)]

    runner.ops = dataclasses.replace(runner.ops, ngram_propose=propose)
