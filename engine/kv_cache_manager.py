"""Which KV blocks each request holds, and prefix caching over them.

Invariants: a request's block list covers at least the tokens it has
computed or scheduled (``len(blocks) * block_size >= num_computed_tokens``
after ``allocate_slots``); blocks only ever get appended to a request's list
until ``free`` returns them all.

Prefix caching (when enabled): the content of full block ``i`` of a request
is named by a chained hash ``h_i = sha256(h_{i-1} || tokens of block i)``,
so equal hashes mean equal token prefixes. A request's ``cache_salt``
(vLLM's) is mixed into its first block's hash only (``h_0`` chains from
``sha256(root || salt)`` instead of the root): every later hash inherits
it, so requests of different salts (or a salt and none) never share a
block, and those of one salt share as any others do. A request's LoRA
adapter is mixed in the same way, by its ``lora_name`` (vLLM's key), before
the salt: KV computed under one adapter is never reused under another or
under none; a request with neither hashes its tokens alone. A full block is registered in
the pool only once the step that writes it has been sent and a later call
sees it (the request's next ``allocate_slots``, or its ``free``): the runner
executes steps in order, so a block is never hit before its KV is written,
whatever the runner's attention reads within a step. A new request's
leading full blocks that match are reused (``get_computed_blocks``) and
their tokens are not computed again. At least one token is always left to
compute, so the runner has a position to sample from.
"""

from __future__ import annotations

import hashlib
from array import array

from engine.block_pool import BlockPool
from engine.request import Request

_ROOT_HASH = b"tprun-prefix-root"


def _first_parent(cache_salt: str | None, lora_name: str | None = None) -> bytes:
    """What a request's first block hash chains from: the root, or for a
    request with a LoRA adapter or a salt the root hashed with the
    adapter's name, then with the salt (never the root itself)."""
    parent = _ROOT_HASH
    if lora_name is not None:
        parent = hashlib.sha256(parent + b"\0lora\0" + lora_name.encode()).digest()
    if cache_salt is not None:
        parent = hashlib.sha256(parent + b"\0salt\0" + cache_salt.encode()).digest()
    return parent


def _chain_hash(parent: bytes, token_ids: list[int]) -> bytes:
    digest = hashlib.sha256(parent)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class KVCacheManager:
    """One KV cache group of ``num_blocks`` blocks of ``block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[int]] = {}
        self._req_hashes: dict[str, list[bytes]] = {}
        self._num_registered: dict[str, int] = {}
        self.prefix_queries = 0  # prompt tokens looked up (first allocation of each request)
        self.prefix_hits = 0  # of which found in the cache

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return self.pool.usage

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def get_block_ids(self, req_id: str) -> list[int]:
        return list(self.req_to_blocks.get(req_id, ()))

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Cached blocks matching the request's leading full blocks, and the
        number of tokens they hold. Nothing is reserved until
        ``allocate_slots`` receives them."""
        if not self.enable_prefix_caching or request.req_id in self.req_to_blocks:
            return [], 0
        hashes = self._block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[int] = ()
    ) -> list[int] | None:
        """Give ``request`` enough blocks for ``num_computed_tokens``, plus
        the prefix hits ``new_computed_blocks``, plus ``num_new_tokens``.

        Returns the newly allocated blocks (hits excluded), or None, changing
        nothing, when too few blocks are free.
        """
        blocks = self.req_to_blocks.get(request.req_id, [])
        if self.enable_prefix_caching:
            # Below num_tokens too: with speculative decoding the computed
            # count may include drafts not verified yet.
            verified = min(request.num_computed_tokens, request.num_tokens)
            self._register_full_blocks(request, blocks, verified)
        num_hit_tokens = len(new_computed_blocks) * self.block_size
        total = request.num_computed_tokens + num_hit_tokens + num_new_tokens
        num_needed = -(-total // self.block_size) - len(blocks) - len(new_computed_blocks)
        if num_needed <= 0 and not new_computed_blocks and blocks:
            return []  # most decode steps: the last block still has room
        revived = sum(self.pool.ref_cnt[b] == 0 for b in new_computed_blocks)
        if num_needed > self.pool.num_free_blocks - revived:
            return None
        if request.req_id not in self.req_to_blocks and self.enable_prefix_caching:
            self.prefix_queries += request.num_tokens
            self.prefix_hits += num_hit_tokens
        self.pool.touch(new_computed_blocks)
        new_blocks = self.pool.allocate(max(num_needed, 0))
        blocks = blocks + list(new_computed_blocks) + new_blocks
        self.req_to_blocks[request.req_id] = blocks
        return new_blocks

    def free(self, request: Request) -> None:
        """Return every block of the request (last block first, so a later
        eviction takes a prefix's tail before its head). Call it before
        resetting the request's ``num_computed_tokens``: the full blocks it
        covers stay cached."""
        blocks = self.req_to_blocks.pop(request.req_id, [])
        if self.enable_prefix_caching:
            self._register_full_blocks(request, blocks, request.num_computed_tokens)
        self.pool.free(reversed(blocks))
        self._req_hashes.pop(request.req_id, None)
        self._num_registered.pop(request.req_id, None)

    def _block_hashes(self, request: Request) -> list[bytes]:
        """Chained hashes of the request's full blocks, extended lazily."""
        hashes = self._req_hashes.setdefault(request.req_id, [])
        tokens = request.all_token_ids
        size = self.block_size
        lora = request.lora_request
        for i in range(len(hashes), len(tokens) // size):
            parent = hashes[-1] if hashes else _first_parent(
                request.cache_salt, None if lora is None else lora.lora_name)
            hashes.append(_chain_hash(parent, tokens[i * size : (i + 1) * size]))
        return hashes

    def _register_full_blocks(self, request: Request, blocks: list[int], num_tokens: int) -> None:
        num_full = num_tokens // self.block_size
        start = self._num_registered.get(request.req_id, 0)
        if num_full <= start:
            return
        hashes = self._block_hashes(request)
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], hashes[i])
        self._num_registered[request.req_id] = num_full
