"""The step timeline's shares on a hand-built record of three decode steps."""

from __future__ import annotations

import pytest

from benchmarks.step_timeline import critical_shares, forward_runs, timeline


def three_steps() -> list[tuple[float, float, str]]:
    """Three steps 50 us apart, each: 3 layers of qkv (4 us), attn (starts
    1 us before qkv ends, ends 2 us after), down (starts 0.5 us after attn
    ends: 4 us to its end), then norm, head, argmax, a copy, the input
    kernel and the embedding; the next step starts 3 us after the last end."""
    records = []
    for s in range(3):
        t0 = 50.0 * s
        for j in range(3):
            t = t0 + 10 * j
            records += [(t, t + 4, "qkv"), (t + 3, t + 6, "attn"), (t + 6.5, t + 10, "down")]
        records += [(t0 + 30, t0 + 31, "norm"), (t0 + 31.5, t0 + 41.5, "head"),
                    (t0 + 42, t0 + 43, "argmax"), (t0 + 44, t0 + 45, "Memcpy HtoD"),
                    (t0 + 45, t0 + 46, "inputs"), (t0 + 45.5, t0 + 47, "embedding")]
    return records


def test_shares_add_up_to_the_step_and_charge_each_kernel_its_delay():
    records = three_steps()
    # (idle before, own share): attn starts inside qkv, down 0.5 us after attn.
    assert critical_shares(records[:3], 0.0) == [(0.0, 4.0), (0.0, 2.0), (0.5, 3.5)]
    # A kernel ending inside another is charged nothing.
    assert critical_shares([(0, 10, "x"), (1, 5, "y"), (2, 12, "z")], 0.0) == [
        (0, 10), (0, 0), (0, 2)]
    k, starts = forward_runs([r[2] for r in records], 3)
    assert (k, starts) == (3, [0, 15, 30])
    t = timeline(records, 3)
    assert t["forwards"] == 2
    assert t["layer"] == [{"kernel": "qkv", "us": 4.0}, {"kernel": "attn", "us": 2.0},
                          {"kernel": "down", "us": 4.0}]
    assert t["layer_us"] == 10.0
    between = {row["kernel"]: row["us"] for row in t["between_layers"]}
    # Idle: 0.5 before head, 0.5 before argmax, 1 before the copy, 3 before
    # the next forward.
    assert between == {"norm": 1.0, "head": 10.0, "argmax": 1.0, "Memcpy HtoD": 1.0,
                       "inputs": 1.0, "embedding": 1.0, "(device idle)": 5.0}
    assert t["idle_before"] == [{"kernel": "head", "us": 0.5}, {"kernel": "argmax", "us": 0.5},
                                {"kernel": "Memcpy HtoD", "us": 1.0}, {"kernel": "qkv", "us": 3.0}]
    assert t["between_layers_us"] == 20.0
    assert t["step_us"] == 50.0 == 3 * t["layer_us"] + t["between_layers_us"]


def test_a_record_without_two_forwards_is_refused():
    with pytest.raises(ValueError, match="no two runs"):
        timeline(three_steps()[:20], 3)
