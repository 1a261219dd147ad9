"""Decisions every rank of the tensor-parallel group takes together.

``every_rank_agrees`` is how the ranks choose between the one-shot
all-reduce and NCCL (``TensorParallelGroup.with_peer_buffers``): one rank
whose GPU cannot map its peers' memory must turn the custom path off on all
of them, or the others would wait in a rendezvous it never joins. Here on
two CPU ranks over gloo, with each rank's own answer given per case.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.multi_rank import RankInfo, run_on_ranks


def agree_on(rank: RankInfo, answers: list[list[bool]]) -> dict[str, torch.Tensor]:
    """Every case of ``answers`` (one bool per rank) through every_rank_agrees."""
    from runner.distributed import every_rank_agrees

    verdicts = [every_rank_agrees(case[rank.rank], rank.device) for case in answers]
    return {"verdicts": torch.tensor(verdicts, dtype=torch.bool)}


@pytest.mark.timeout(150)
def test_one_rank_saying_no_turns_it_off_on_every_rank():
    answers = [[True, True], [True, False], [False, True], [False, False]]
    results = run_on_ranks(agree_on, world_size=2, kwargs={"answers": answers},
                           backend="gloo")
    for result in results:
        assert result["verdicts"].tolist() == [True, False, False, False]
