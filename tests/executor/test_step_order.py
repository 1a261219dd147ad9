"""``StepOrder``: the order a rank runs plans and bitmasks in, on hand-worked
message sequences (the callbacks record what runs). The rank must run
forward N, sample N, forward N+1 whatever order the engine's messages take,
keep at most one plan, and reject (never hang on) a bitmask that is missing
or meant for another step."""

from __future__ import annotations

from ipc.messages import GrammarBitmask, SchedulerOutput
from worker.step_order import StepOrder


class _Rank:
    def __init__(self, refuse: tuple[int, ...] = ()):
        self.log: list[tuple] = []
        self.refuse = refuse
        self.order = StepOrder(self.forward, self.sample, self.reject)

    def forward(self, plan: SchedulerOutput) -> bool:
        if plan.step_id in self.refuse:
            self.log.append(("reject", plan.step_id, "plan"))
            return False
        self.log.append(("forward", plan.step_id))
        return True

    def sample(self, step_id: int, grammar: GrammarBitmask | None) -> None:
        self.log.append(("sample", step_id, None if grammar is None else "mask"))

    def reject(self, step_id: int, reason: str) -> None:
        self.log.append(("reject", step_id, reason))


def _plan(step_id: int, constrained: bool) -> SchedulerOutput:
    return SchedulerOutput(step_id=step_id,
                           structured_output_req_ids=["r"] if constrained else [])


def _mask(step_id: int) -> GrammarBitmask:
    return GrammarBitmask(step_id=step_id, req_ids=["r"], bitmask=b"")


def test_unconstrained_plans_run_at_once():
    rank = _Rank()
    for i in range(3):
        rank.order.on_plan(_plan(i, False))
    assert rank.log == [("forward", 0), ("sample", 0, None), ("forward", 1), ("sample", 1, None),
                        ("forward", 2), ("sample", 2, None)]


def test_the_overlapped_order_runs_each_step_after_the_one_before_samples():
    """The engine's async order: plan 0, plan 1, mask 0, plan 2, mask 1, mask 2."""
    rank = _Rank()
    rank.order.on_plan(_plan(0, True))
    rank.order.on_plan(_plan(1, True))
    assert rank.log == [("forward", 0)]  # plan 1 is kept
    rank.order.on_bitmask(_mask(0))
    rank.order.on_plan(_plan(2, False))
    rank.order.on_bitmask(_mask(1))
    assert rank.log == [("forward", 0), ("sample", 0, "mask"), ("forward", 1),
                        ("sample", 1, "mask"), ("forward", 2), ("sample", 2, None)]
    assert rank.order.awaiting is None and rank.order.early is None


def test_a_second_plan_rejects_the_step_whose_bitmask_did_not_come():
    rank = _Rank()
    rank.order.on_plan(_plan(0, True))
    rank.order.on_plan(_plan(1, True))
    rank.order.on_plan(_plan(2, False))
    assert rank.log[:2] == [("forward", 0),
                            ("reject", 0, "its grammar bitmask did not come before step 2's plan")]
    # Plan 1 ran and awaits its own bitmask; plan 2 is kept behind it.
    assert rank.log[2:] == [("forward", 1)]
    rank.order.on_bitmask(_mask(1))
    assert rank.log[3:] == [("sample", 1, "mask"), ("forward", 2), ("sample", 2, None)]


def test_a_bitmask_for_another_step_is_rejected_and_the_wait_goes_on():
    rank = _Rank()
    rank.order.on_bitmask(_mask(5))  # nothing awaited
    rank.order.on_plan(_plan(0, True))
    rank.order.on_plan(_plan(1, False))
    rank.order.on_bitmask(_mask(1))  # not the awaited step's
    assert rank.log == [("reject", 5, "no step waits for this grammar bitmask"), ("forward", 0),
                        ("reject", 1, "no step waits for this grammar bitmask")]
    rank.order.on_bitmask(_mask(0))
    assert rank.log[3:] == [("sample", 0, "mask"), ("forward", 1), ("sample", 1, None)]


def test_a_refused_plan_awaits_nothing_and_a_kept_refused_plan_is_dropped():
    rank = _Rank(refuse=(0, 2))
    rank.order.on_plan(_plan(0, True))  # refused: no bitmask is awaited for it
    rank.order.on_plan(_plan(1, True))
    rank.order.on_plan(_plan(2, False))  # kept behind step 1
    rank.order.on_bitmask(_mask(1))
    rank.order.on_plan(_plan(3, False))
    assert rank.log == [("reject", 0, "plan"), ("forward", 1), ("sample", 1, "mask"),
                        ("reject", 2, "plan"), ("forward", 3), ("sample", 3, None)]
