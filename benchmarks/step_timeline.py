"""Where a decode step's device time goes: its kernels on the critical path.

With programmatic dependent launch a kernel starts before the one before it
ends (its programs wait), so kernel times overlap and a kernel table
(``bench_decode --kernel-table``) cannot say what a step waits for. Here
each kernel (and copy) of the profiler's records is charged the time by
which it moves the step's end: its end minus the latest end before it
(zero if it ends inside another). Those shares add up to the step.

The step's layers are found by their repetition: a run of ``num_layers``
repetitions of one pattern of kernel names (the shortest pattern that
repeats so) is one forward's layers; whatever lies between two forwards
(the final norm, the LM head, the sampler, the copies, the next step's
input kernels and embedding) is the step's "between layers" part.
``timeline`` gives, as medians over the steps and layers found, each
layer position's kernel and share, the layer's total, and the shares of
what lies between the forwards by kernel name.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

# (start us, end us, name), in start order
Record = tuple[float, float, str]


def kernel_records(driver, steps: int, overlap: bool = True) -> list[Record]:
    """The CUDA kernels and copies of ``steps`` decode steps of ``driver``
    (``bench_decode.DecodeDriver``), run with one step in flight (or,
    ``overlap`` False, each waited for)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        driver.run(steps, overlap)
    return sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA
                   and e.time_range.end > e.time_range.start), key=lambda r: r[0])


def critical_shares(records: list[Record], since: float) -> list[tuple[float, float]]:
    """Each record's share of the critical path after time ``since``, as
    (idle, own): the time the device ran nothing before it started, and
    by how much its end passes the latest end before it (or ``since``)
    once it runs; a record ending inside another has neither."""
    latest, shares = since, []
    for start, end, _ in records:
        idle = max(start - latest, 0.0)
        shares.append((idle, max(end - max(start, latest), 0.0)))
        latest = max(latest, end)
    return shares


def forward_runs(names: list[str], num_layers: int, max_period: int = 16
                 ) -> tuple[int, list[int]]:
    """(layer pattern length k, start index of each forward): the smallest k
    for which ``names`` holds runs of ``num_layers`` repetitions of a k-name
    pattern, and where each such run starts (non-overlapping, in order)."""
    for k in range(1, max_period + 1):
        span, starts, i = num_layers * k, [], 0
        while i + span <= len(names):
            if all(names[j] == names[j + k] for j in range(i, i + span - k)):
                starts.append(i)
                i += span
            else:
                i += 1
        if len(starts) >= 2 and num_layers > 1:
            return k, starts
    raise ValueError(f"no two runs of {num_layers} repeated layers in {len(names)} kernels")


def timeline(records: list[Record], num_layers: int) -> dict:
    """Medians over the forwards found (each but the last, which has no
    next one to end it): ``layer`` [{"kernel", "us"}] by position in the
    layer (a kernel's share counts the launch gap before it), ``layer_us``
    (a layer's critical path), ``between_layers`` [{"kernel", "us"}] (each
    name's own share between two forwards, in the order first seen, then
    the device's idle time there, the gaps the host or the launches left),
    ``between_layers_us``, ``idle_before`` [{"kernel", "us"}] (where that
    idle lies: the device's idle time just before each name between two
    forwards, the next forward's first kernel included, where a median is
    above zero) and ``step_us`` (one forward's first kernel's start to the
    next's)."""
    names = [name for _, _, name in records]
    k, starts = forward_runs(names, num_layers)
    shares = critical_shares(records, records[0][0])
    by_position = defaultdict(list)
    layer_totals, between_totals, steps = [], [], []
    between_by_name: dict[str, list[float]] = {}
    idle_by_name: dict[str, list[float]] = {}
    idle_name = "(device idle)"
    for first, next_first in zip(starts, starts[1:]):
        end_layers = first + num_layers * k
        # The first kernel's wait to start belongs to what came before it.
        layers = [shares[first][1]] + [sum(sh) for sh in shares[first + 1:end_layers]]
        for i, share in enumerate(layers):
            by_position[i % k].append(share)
        layer_totals += [sum(layers[j * k:(j + 1) * k]) for j in range(num_layers)]
        # Own shares of the records between the forwards; the idle before
        # each of them and before the next forward's first kernel.
        step_between: dict[str, float] = defaultdict(float)
        step_idle: dict[str, float] = defaultdict(float)
        for i in range(end_layers, next_first + 1):
            name, (idle, own) = records[i][2], shares[i]
            step_idle[name] += idle
            if i < next_first:
                step_between[name] += own
        step_between[idle_name] = sum(step_idle.values())
        for name, share in step_between.items():
            between_by_name.setdefault(name, []).append(share)
        for name, idle in step_idle.items():
            idle_by_name.setdefault(name, []).append(idle)
        between_totals.append(sum(step_between.values()))
        steps.append(sum(layers) + between_totals[-1])
    median = statistics.median

    def median_of(values: list[float]) -> float:  # a name missing from a step counts 0
        return round(median(values + [0.0] * (len(steps) - len(values))), 2)

    return {
        "forwards": len(steps),
        "layer": [{"kernel": names[starts[0] + i], "us": round(median(by_position[i]), 2)}
                  for i in range(k)],
        "layer_us": round(median(layer_totals), 2),
        "between_layers": [{"kernel": name, "us": median_of(v)}
                           for name, v in between_by_name.items()],
        "between_layers_us": round(median(between_totals), 2),
        "idle_before": [{"kernel": name, "us": median_of(v)}
                        for name, v in idle_by_name.items() if median_of(v) > 0],
        "step_us": round(median(steps), 2),
    }
