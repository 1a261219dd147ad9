"""BlockPool: a stateful fuzz against a plain reference-count model, and
the eviction order prefix caching relies on."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.block_pool import BlockPool, OutOfBlocksError

NUM_BLOCKS = 12


class PoolMachine(RuleBasedStateMachine):
    """Holders own lists of block references; the model counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(NUM_BLOCKS)
        self.holders: list[list[int]] = []
        self.hashes: dict[bytes, int] = {}  # hashes we registered and saw kept

    def model_counts(self) -> list[int]:
        counts = [0] * NUM_BLOCKS
        for held in self.holders:
            for block in held:
                counts[block] += 1
        return counts

    @rule(n=st.integers(0, NUM_BLOCKS + 2))
    def allocate(self, n: int) -> None:
        free_before = self.pool.num_free_blocks
        if n > free_before:
            with pytest.raises(OutOfBlocksError):
                self.pool.allocate(n)
            assert self.pool.num_free_blocks == free_before
            return
        blocks = self.pool.allocate(n)
        assert len(set(blocks)) == n
        assert all(c == 0 for c in (self.model_counts()[b] for b in blocks))
        for block in blocks:  # reused blocks lose their old content
            self.hashes = {h: b for h, b in self.hashes.items() if b != block}
        self.holders.append(blocks)

    @precondition(lambda self: self.holders)
    @rule(i=st.integers(0, 100))
    def free(self, i: int) -> None:
        self.pool.free(self.holders.pop(i % len(self.holders)))

    @precondition(lambda self: self.holders)
    @rule(i=st.integers(0, 100), tag=st.binary(min_size=1, max_size=2))
    def cache(self, i: int, tag: bytes) -> None:
        held = self.holders[i % len(self.holders)]
        if not held:
            return
        block = held[0]
        self.pool.cache_block(block, tag)
        if tag not in self.hashes and block not in self.hashes.values():
            self.hashes[tag] = block
        assert self.pool.lookup(tag) == self.hashes.get(tag)

    @precondition(lambda self: self.hashes)
    @rule(i=st.integers(0, 100))
    def hit(self, i: int) -> None:
        tag = sorted(self.hashes)[i % len(self.hashes)]
        block = self.pool.lookup(tag)
        assert block == self.hashes[tag]
        self.pool.touch([block])
        self.holders.append([block])

    @precondition(lambda self: any(c == 0 for c in self.model_counts()))
    @rule()
    def double_free_raises(self) -> None:
        block = self.model_counts().index(0)
        with pytest.raises(ValueError, match="freed more often"):
            self.pool.free([block])

    @invariant()
    def matches_model(self) -> None:
        self.pool.check_invariants()
        counts = self.model_counts()
        assert self.pool.ref_cnt == counts
        assert self.pool.num_free_blocks == counts.count(0)
        assert self.pool.num_free_blocks + self.pool.num_used_blocks == NUM_BLOCKS
        assert self.pool.num_cached_blocks == len(self.hashes)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_eviction_prefers_uncached_then_least_recently_freed():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.cache_block(blocks[0], b"a")
    pool.cache_block(blocks[1], b"b")
    pool.free([blocks[1]])  # cached, freed first
    pool.free([blocks[0]])  # cached, freed second
    pool.free([blocks[2]])  # uncached
    assert pool.allocate(1) == [blocks[2]]
    assert pool.lookup(b"a") == blocks[0] and pool.lookup(b"b") == blocks[1]
    assert pool.allocate(1) == [blocks[1]]  # least recently freed cached block goes
    assert pool.lookup(b"b") is None and pool.lookup(b"a") == blocks[0]
    pool.check_invariants()


def test_touch_revives_a_free_cached_block():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.cache_block(block, b"x")
    pool.free([block])
    assert pool.num_free_blocks == 2
    pool.touch([pool.lookup(b"x")])
    assert pool.num_free_blocks == 1 and pool.ref_cnt[block] == 1
    pool.check_invariants()


def test_check_invariants_catches_corruption():
    pool = BlockPool(3)
    pool.allocate(1)
    pool.ref_cnt[0] = 0  # used block with count 0, not in the free queue
    with pytest.raises(AssertionError, match="block 0"):
        pool.check_invariants()


@pytest.mark.parametrize("n", [0, -1, 1.5])
def test_invalid_size(n):
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(n)
