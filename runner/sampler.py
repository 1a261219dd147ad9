"""Sampling on the device, without a host sync.

Per-slot sampling parameters live in persistent tensors written by staged
writes when a request is added; each step gathers them by the batch's slot
numbers. Random draws are stateless: the noise of a request at a position is
a hash of (seed, position, token id), so a seeded request draws the same
tokens alone or in any batch, and every TP rank draws the same token without
talking to the others. Unseeded requests get a seed from the runner's own
generator when they are added.
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.messages import SamplingOptions
from runner.staged_write import StagedWriteTensor

_MASK63 = (1 << 63) - 1


class SamplingStates:
    """Sampling parameters of every slot (temperature 0 = greedy)."""

    def __init__(self, max_num_reqs: int, device: torch.device, seed: int):
        self.temperature = StagedWriteTensor((max_num_reqs,), torch.float32, device)
        self.seeds = StagedWriteTensor((max_num_reqs,), torch.int64, device)
        self.temperature_np = np.zeros(max_num_reqs, dtype=np.float32)
        self.rng = np.random.default_rng(seed)

    def add_request(self, slot: int, options: SamplingOptions) -> None:
        seed = options.seed if options.seed is not None else int(self.rng.integers(0, 2**62))
        self.temperature_np[slot] = options.temperature
        self.temperature.stage_write_elem(slot, options.temperature)
        self.seeds.stage_write_elem(slot, seed & _MASK63)

    def apply_staged_writes(self) -> None:
        self.temperature.apply_write()
        self.seeds.apply_write()


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 64-bit integer hash (splitmix64 finaliser) on int64, wrapping."""
    x = x ^ ((x >> 30) & 0x3FFFFFFFF)
    x = x * -4658895280553007687  # 0xBF58476D1CE4E5B9 as int64
    x = x ^ ((x >> 27) & 0x1FFFFFFFFF)
    x = x * -7723592293110705685  # 0x94D049BB133111EB as int64
    x = x ^ ((x >> 31) & 0x1FFFFFFFF)
    return x


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniform (0, 1) float32 noise [N, vocab], a function of (seed, position) only."""
    base = _mix(seeds * 1_000_003 + positions)  # [N]
    token = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = _mix(base[:, None] ^ (token[None, :] * 0x1E3779B97F4A7C15))
    mantissa = (bits >> 40) & 0xFFFFFF  # 24 random bits
    return (mantissa.to(torch.float32) + 0.5) / float(1 << 24)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    all_greedy: bool,
) -> torch.Tensor:
    """Token ids [N] int64: argmax where temperature == 0, else Gumbel-max.

    ``logits`` [N, V] float32; ``temperature``, ``seeds``, ``positions`` [N]
    gathered for the rows. ``all_greedy`` (known on the host) skips the noise.
    """
    greedy = logits.argmax(dim=-1)
    if all_greedy:
        return greedy
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    gumbel = -torch.log(-torch.log(uniform_noise(seeds, positions, logits.shape[-1])))
    sampled = (logits / temp[:, None] + gumbel).argmax(dim=-1)
    return torch.where(temperature > 0, sampled, greedy)
