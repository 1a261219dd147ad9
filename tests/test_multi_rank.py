"""The multi-rank harness (tests/helpers/multi_rank.py) on the CPU: results come back
per rank, a failing rank's error comes back, one flipped bit is caught."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.helpers.multi_rank import RankInfo, assert_ranks_bitwise_equal, run_on_ranks


def reduce_rank_values(rank: RankInfo, scale: float) -> dict[str, torch.Tensor]:
    """Rank function: every rank's own values, then their sum over the ranks."""
    own = torch.arange(5, dtype=torch.float32, device=rank.device) * scale + rank.rank
    total = own.clone()
    rank.tp.all_reduce(total)
    return {"own": own, "sum": total, "tp_rank": torch.tensor(rank.tp.rank)}


def fail_on_rank_one(rank: RankInfo) -> dict[str, torch.Tensor]:
    if rank.rank == 1:
        raise ValueError("rank one gives up")
    dist.barrier()  # left waiting for its peer: the harness must end it
    return {}


@pytest.mark.timeout(120)
def test_results_per_rank_and_the_sum_on_every_rank():
    results = run_on_ranks(reduce_rank_values, 2, {"scale": 0.5}, backend="gloo")
    base = torch.arange(5, dtype=torch.float32) * 0.5
    assert [int(r["tp_rank"]) for r in results] == [0, 1]
    for rank, result in enumerate(results):
        assert torch.equal(result["own"], base + rank)
        assert torch.equal(result["sum"], 2 * base + 1)
    with pytest.raises(AssertionError, match="'own': rank 1 differs"):
        assert_ranks_bitwise_equal([{"own": r["own"]} for r in results])
    assert_ranks_bitwise_equal([{"sum": r["sum"]} for r in results])


@pytest.mark.timeout(120)
def test_a_failing_rank_raises_with_its_error():
    with pytest.raises(RuntimeError, match="rank one gives up") as info:
        run_on_ranks(fail_on_rank_one, 2, backend="gloo", timeout_s=60)
    assert "--- rank 1 (exit 1)" in str(info.value)


def test_one_bit_apart_is_caught():
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[17] = torch.nextafter(y[17], torch.tensor(float("inf")))
    with pytest.raises(AssertionError, match="'x': rank 1 differs"):
        assert_ranks_bitwise_equal([{"x": x}, {"x": y}])
    with pytest.raises(AssertionError):  # equal as numbers, not as bits
        assert_ranks_bitwise_equal([{"x": torch.tensor([0.0])}, {"x": torch.tensor([-0.0])}])
    with pytest.raises(AssertionError):
        assert_ranks_bitwise_equal([{"x": x}, {"x": x.double()}])
    nan = torch.tensor([float("nan"), 1.0])
    assert_ranks_bitwise_equal([{"x": nan}, {"x": nan.clone()}, {"x": nan.clone()}])
