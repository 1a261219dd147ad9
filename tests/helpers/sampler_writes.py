"""A Sampler's added requests written to the device the way the runner writes them."""

import torch

from runner.sampler import Sampler
from runner.staged_write_group import StagedWriteGroup


def write_added_requests(sampler: Sampler, all_token_ids: torch.Tensor) -> None:
    """The runner's two parts, in its order: one group applies the staged
    parameter writes (here a group of the sampler's tensors alone), then the
    rows built on the device from ``all_token_ids`` (penalties, min-tokens
    stop ids)."""
    StagedWriteGroup(sampler.staged_tensors).apply_writes()
    sampler.write_added_rows(all_token_ids)
