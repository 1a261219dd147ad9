"""Grammar bitmasks written by hand from their definition (tests of the
mask kernel, the runner and the executors)."""

from __future__ import annotations

import numpy as np

from ipc.messages import GrammarBitmask


def words_allowing(vocab: int, allowed: list[int]) -> list[int]:
    """int32 words with exactly the bits of ``allowed`` set, written by hand
    from the definition (bit j of word w is token 32 * w + j)."""
    words = [0] * ((vocab + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def mask_message(step_id: int, allowed: dict[str, list[int]], vocab: int) -> GrammarBitmask:
    """The step's bitmask letting each request sample exactly its listed tokens."""
    rows = [words_allowing(vocab, tokens) for tokens in allowed.values()]
    data = np.array(rows, dtype="<i4").reshape(len(rows), (vocab + 31) // 32).tobytes()
    return GrammarBitmask(step_id=step_id, req_ids=list(allowed), bitmask=data)
