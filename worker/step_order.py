"""The order in which one rank runs its step messages (plans and bitmasks).

A step is a plan (``SchedulerOutput``) and, when the plan lists
``structured_output_req_ids``, its ``GrammarBitmask``. The runner holds one
step between its two calls (``execute_model``, then ``sample_tokens``), and
a step's forward pass reads the tokens the step before it sampled, so a
rank runs the steps one after the other: forward N, sample N, forward N+1.

With async scheduling the engine fills step N's bitmask while it schedules
step N+1 and sends N+1's plan first (the fill runs beside the scheduling,
off the engine loop), so a plan may arrive while the rank still waits for
the bitmask of the step before it. ``StepOrder`` keeps that plan (at most
one) and runs it as soon as the awaited step has sampled. Per rank:

- a plan with nothing awaited: forward at once; sample at once unless it is
  constrained (then its bitmask is awaited);
- a plan while a bitmask is awaited: kept (``early``); a second plan then
  means the awaited bitmask is not coming: that step is rejected, and the
  kept plan and the new one run in their order;
- a bitmask for the awaited step: sample with it (``sample`` checks it: a
  bitmask that does not fit rejects the step), then run the kept plan;
- a bitmask for any other step: rejected; the awaited step still waits.

Every rank receives the same messages in the same order (one broadcast) and
reaches the same verdicts, so the ranks' runners stay in step and their
collectives match. Unconstrained steps take exactly the old path: forward
and sample on arrival, nothing kept, nothing awaited.

The callbacks are the rank's: ``forward(plan) -> bool`` (False once it has
reported the plan rejected or failed), ``sample(step_id, bitmask | None)``
and ``reject(step_id, reason)``.
"""

from __future__ import annotations

from collections.abc import Callable

from ipc.messages import GrammarBitmask, SchedulerOutput


class StepOrder:
    def __init__(self, forward: Callable[[SchedulerOutput], bool],
                 sample: Callable[[int, GrammarBitmask | None], None],
                 reject: Callable[[int, str], None]):
        self._forward, self._sample, self._reject = forward, sample, reject
        self.awaiting: int | None = None  # the step whose forward ran; its bitmask is due
        self.early: SchedulerOutput | None = None  # the next plan, kept until then

    def on_plan(self, plan: SchedulerOutput) -> None:
        if self.awaiting is None:
            self._start(plan)
        elif self.early is None:
            self.early = plan
        else:
            step_id, self.awaiting = self.awaiting, None
            self._reject(step_id, f"its grammar bitmask did not come before step "
                         f"{plan.step_id}'s plan")
            kept, self.early = self.early, None
            self._start(kept)
            self.on_plan(plan)

    def on_bitmask(self, grammar: GrammarBitmask) -> None:
        if self.awaiting is None or grammar.step_id != self.awaiting:
            self._reject(grammar.step_id, "no step waits for this grammar bitmask")
            return
        self.awaiting = None
        self._sample(grammar.step_id, grammar)
        if self.early is not None:
            kept, self.early = self.early, None
            self._start(kept)

    def _start(self, plan: SchedulerOutput) -> None:
        if not self._forward(plan):
            return
        if plan.structured_output_req_ids:
            self.awaiting = plan.step_id
        else:
            self._sample(plan.step_id, None)
