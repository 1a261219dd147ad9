"""SlotUsers: the host bookkeeping the sampler's per-slot list tables share,
checked against cases worked by hand."""

import numpy as np

from runner.sampling.slot_users import SlotUsers


def test_changes_come_back_in_order_with_their_own_needs():
    """A slot freed and taken again before a write: the clearing comes
    first, then the new row; a slot that never used the table queues
    nothing."""
    users = SlotUsers(4, (2, 3))
    users.set(1, (3, 5), "first")
    users.set(2, (0, 0), "never")
    users.clear(1, "empty")
    users.set(1, (1, 2), "second")
    users.clear(3, "nothing")  # never used: no change
    assert users.take_changes() == [(1, (3, 5), "first"), (1, (0, 0), "empty"),
                                    (1, (1, 2), "second")]
    assert users.take_changes() == []
    assert users.num_users == 1 and users.uses_np.tolist() == [False, True, False, False]


def test_grown_takes_the_larger_of_each_dimension():
    users = SlotUsers(2, (4, 4))
    assert users.grown((4, 3), (4, 4)) is None
    assert users.grown((2, 9), (4, 4)) == (4, 9)
    assert users.grown((7, 1), (4, 9)) == (7, 9)


def test_shrunk_only_after_a_user_left_and_only_by_half():
    """Tables of (8, 16): a leaving user whose neighbours need (5, 9) does
    not shrink them (neither dimension halves); once the (5, 9) user leaves
    too, the remaining (1, 2) user and the initial (2, 3) give (2, 3)."""
    users = SlotUsers(3, (2, 3))
    users.set(0, (8, 16), "wide")
    users.set(1, (5, 9), "middle")
    users.set(2, (1, 2), "small")
    assert users.shrunk((8, 16)) is None  # nobody left yet
    users.clear(0, "")
    assert users.shrunk((8, 16)) is None  # (5, 9): no dimension halves
    assert users.shrunk((8, 16)) is None  # the leave was consumed
    users.clear(1, "")
    assert users.shrunk((8, 16)) == (2, 3)
    assert np.array_equal(users.needs_np, [[0, 0], [0, 0], [1, 2]])


def test_any_active_reads_the_batch_slots():
    users = SlotUsers(4, (1,))
    assert not users.any_active(np.array([0, 1, 2, 3]))
    users.set(2, (1,), [7])
    assert users.any_active(np.array([3, 2])) and not users.any_active(np.array([0, 1]))
