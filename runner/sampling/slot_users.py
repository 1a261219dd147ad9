"""Which slots use one of the sampler's per-slot list tables, and how large
the tables must be: the host side that bad words, token lists and
min_tokens' stop ids share.

Such a table has one device row per slot and dimensions (list count, list
width, ...) sized to its users rather than to the largest allowed request,
so a batch of plain requests reads small rows. ``SlotUsers`` keeps, on the
host only:

- ``uses_np[slot]``: the slot's request uses the table, and ``num_users``,
  their count, so a runner or a batch without users never looks at it;
- ``needs_np[slot]``: the size along each dimension the slot's row needs
  (all 0 for a slot without use);
- the row changes since the last ``take_changes``, in the order made, each
  with the needs of its own row. Writing them in that order leaves every
  row as its slot's latest request wants it: a slot freed and taken again
  in one plan is first cleared, then written (or left cleared), so a
  request never meets its predecessor's lists.

Sizing rule: a table grows when a changed row needs more than it has
(``grown``), and shrinks, once users have left, to what the remaining
users need - at least the initial size - when that is at most half of
some dimension (``shrunk``): one request with long lists costs nothing
after it is gone, and the tables do not resize with every request.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import numpy as np
import torch

Row = TypeVar("Row")


class SlotUsers(Generic[Row]):
    def __init__(self, max_num_reqs: int, initial: tuple[int, ...]):
        self.initial = np.array(initial, dtype=np.int64)
        self.uses_np = np.zeros(max_num_reqs, dtype=bool)
        self.num_users = 0
        self.needs_np = np.zeros((max_num_reqs, len(initial)), dtype=np.int64)
        self._changes: list[tuple[int, tuple[int, ...], Row]] = []
        self._left = False  # a user left since the last ``shrunk``

    def set(self, slot: int, needs: tuple[int, ...], row: Row) -> None:
        """The slot's new request needs a row of ``needs`` (all 0: it does not
        use the table) holding ``row``; queued when the slot's row changes
        (it is used now or was before)."""
        uses = any(needs)
        had = bool(self.uses_np[slot])
        self.num_users += uses - had
        self.uses_np[slot] = uses
        self.needs_np[slot] = needs
        if uses or had:
            self._changes.append((slot, tuple(needs), row))

    def clear(self, slot: int, empty: Row) -> None:
        """The slot's request left: its row becomes ``empty`` and the table
        may shrink."""
        if self.uses_np[slot]:
            self.set(slot, (0,) * len(self.initial), empty)
            self._left = True

    def take_changes(self) -> list[tuple[int, tuple[int, ...], Row]]:
        """The queued (slot, needs, row) changes, oldest first, now forgotten."""
        changes, self._changes = self._changes, []
        return changes

    @staticmethod
    def grown(needs: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The size a table of ``shape`` grows to for a row of ``needs``, or
        None when it fits."""
        if all(n <= s for n, s in zip(needs, shape)):
            return None
        return tuple(int(x) for x in np.maximum(needs, shape))

    def shrunk(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The size a table of ``shape`` shrinks to now that users have left,
        or None (no one left since the last call, or no dimension would
        halve)."""
        if not self._left:
            return None
        self._left = False
        needed = np.maximum(self.initial, self.needs_np.max(axis=0))
        if not np.any(2 * needed <= np.asarray(shape)):
            return None
        return tuple(int(x) for x in needed)

    def any_active(self, idx_mapping_np: np.ndarray) -> bool:
        """Some slot of the batch uses the table."""
        return self.num_users > 0 and bool(np.any(self.uses_np[idx_mapping_np]))


def with_width(table: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    """``table`` [rows, w] as a new [rows, ``width``] table holding each
    row's first entries that fit, ``fill`` after them (a left-aligned list
    table resized to what ``SlotUsers`` says its users need)."""
    kept = min(width, table.shape[1])
    resized = torch.full((table.shape[0], width), fill, dtype=table.dtype, device=table.device)
    resized[:, :kept] = table[:, :kept]
    return resized
