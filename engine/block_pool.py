"""The pool of KV cache blocks: a free queue, reference counts, and a map
from content hashes to blocks for prefix caching.

Invariants (``check_invariants`` verifies them):

- every block id in ``[0, num_blocks)`` is either free (reference count 0
  and in the free queue) or used (count > 0 and not in the queue), never
  both, so ``num_free_blocks + num_used_blocks == num_blocks``;
- reference counts are never negative;
- a block has at most one hash, a hash names at most one block, and the
  two maps agree. A free block may keep its hash: its content stays valid
  (a prefix cache hit can revive it) until ``allocate`` hands it out again,
  which drops the hash.

The free queue is in eviction order: blocks without a hash first (they hold
nothing worth keeping), then hashed blocks from least to most recently
freed, so ``allocate`` evicts the least recently used cached content last.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class OutOfBlocksError(RuntimeError):
    """``allocate`` was asked for more blocks than are free."""


class BlockPool:
    """Fixed set of ``num_blocks`` KV blocks with ids ``0 .. num_blocks-1``."""

    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._block_hash: list[bytes | None] = [None] * num_blocks
        self._hash_to_block: dict[bytes, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks ``allocate`` can hand out now (cached-but-free included)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return self.num_used_blocks / self.num_blocks

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks (reference count 1 each), evicting cached
        content if needed. Raises ``OutOfBlocksError`` when fewer than ``n``
        are free; nothing is taken then."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            raise OutOfBlocksError(f"asked for {n} blocks, only {len(self._free)} free")
        blocks = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            self._drop_hash(block)
            self.ref_cnt[block] = 1
            blocks.append(block)
        return blocks

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; a block whose count reaches 0
        goes back to the free queue (to its end if it holds cached content,
        to its front otherwise). Freeing a free block raises ``ValueError``."""
        for block in block_ids:
            if self.ref_cnt[block] <= 0:
                raise ValueError(f"block {block} freed more often than it was taken")
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                self._free[block] = None
                if self._block_hash[block] is None:
                    self._free.move_to_end(block, last=False)

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one more reference to each block (prefix cache hits); a free
        cached block leaves the free queue."""
        for block in block_ids:
            if self.ref_cnt[block] == 0:
                del self._free[block]
            self.ref_cnt[block] += 1

    def lookup(self, block_hash: bytes) -> int | None:
        """The block holding content with this hash, if any (used or free)."""
        return self._hash_to_block.get(block_hash)

    def cache_block(self, block_id: int, block_hash: bytes) -> None:
        """Record that used block ``block_id`` holds content ``block_hash``.
        No-op if the block already has a hash or another block holds it."""
        if self.ref_cnt[block_id] <= 0:
            raise ValueError(f"cannot cache free block {block_id}")
        if self._block_hash[block_id] is not None or block_hash in self._hash_to_block:
            return
        self._block_hash[block_id] = block_hash
        self._hash_to_block[block_hash] = block_id

    def block_hash(self, block_id: int) -> bytes | None:
        return self._block_hash[block_id]

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_to_block)

    def reset_prefix_cache(self) -> None:
        """Forget every hash (e.g. after new weights are loaded)."""
        self._hash_to_block.clear()
        self._block_hash = [None] * self.num_blocks

    def _drop_hash(self, block: int) -> None:
        block_hash = self._block_hash[block]
        if block_hash is not None:
            del self._hash_to_block[block_hash]
            self._block_hash[block] = None

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a block is in the free queue twice")
        for block, count in enumerate(self.ref_cnt):
            if count < 0:
                raise AssertionError(f"block {block} has reference count {count}")
            if (count == 0) != (block in free):
                raise AssertionError(
                    f"block {block}: count {count}, in free queue: {block in free}"
                )
        if not free <= set(range(self.num_blocks)):
            raise AssertionError("free queue holds an unknown block id")
        if self.num_free_blocks + sum(c > 0 for c in self.ref_cnt) != self.num_blocks:
            raise AssertionError("free + used != total")
        hashed = {b: h for b, h in enumerate(self._block_hash) if h is not None}
        if len(hashed) != len(self._hash_to_block):
            raise AssertionError("block->hash and hash->block maps differ in size")
        for block, block_hash in hashed.items():
            if self._hash_to_block.get(block_hash) != block:
                raise AssertionError(f"block {block}'s hash maps elsewhere")
