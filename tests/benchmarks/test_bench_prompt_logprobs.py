"""benchmarks/bench_prompt_logprobs.py: the check of the kernel's run against
the torch run (hand-made deltas), and the three runs on CPU (tiny shape)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.bench_e2e import time_to_first_token
from benchmarks.bench_prompt_logprobs import LOGPROB_ATOL, compare_outputs
from engine.outputs import Logprob, RequestOutputDelta


def _delta(req_id, token, entries):
    return RequestOutputDelta(req_id, [token], True, "length",
                              prompt_logprobs=[None, *entries])


def test_compare_outputs_names_what_differs():
    same = [_delta("a", 5, [{3: Logprob(-0.5, 1)}, {4: Logprob(-1.0, 2), 8: Logprob(-0.2, 1)}])]
    # A tie for the top token named by another id of the same value: the same.
    tie = [_delta("a", 5, [{3: Logprob(-0.5, 1)}, {4: Logprob(-1.0, 2), 9: Logprob(-0.2, 1)}])]
    assert compare_outputs(same, tie) == []
    close = [_delta("a", 5, [{3: Logprob(-0.5 + LOGPROB_ATOL / 2, 1)},
                             {4: Logprob(-1.0, 2), 8: Logprob(-0.2, 1)}])]
    assert compare_outputs(same, close) == []
    far = [_delta("a", 5, [{3: Logprob(-0.5 + 2 * LOGPROB_ATOL, 1)},
                           {4: Logprob(-1.0, 2), 8: Logprob(-0.2, 1)}])]
    problems = compare_outputs(same, far)
    assert len(problems) == 1 and problems[0].startswith("prompt 0 position 1: ")
    other_token = [_delta("a", 6, [{3: Logprob(-0.5, 1)},
                                   {4: Logprob(-1.0, 2), 8: Logprob(-0.2, 1)}])]
    assert compare_outputs(same, other_token) == ["prompt 0: first token [5] != [6]"]
    fewer = [_delta("a", 5, [{3: Logprob(-0.5, 1)}, {8: Logprob(-0.2, 1)}])]
    assert len(compare_outputs(same, fewer)) == 1


@pytest.mark.timeout(120)
def test_ttft_keeps_the_last_rounds_outputs_in_prompt_order(tmp_path):
    from benchmarks.shapes import write_shape

    model_dir = write_shape("tiny", str(tmp_path))
    args = argparse.Namespace(ttft_prompts=3, ttft_len=24, ttft_rounds=1, device="cpu",
                              dtype="float32", ttft_batched_tokens=64, attention_backend=None,
                              prompt_logprobs=2)
    result = time_to_first_token(model_dir, args, keep_outputs=True)
    outputs = result.pop("outputs")
    assert len(outputs) == 3 and all(len(d.new_token_ids) == 1 for d in outputs)
    assert all(len(d.prompt_logprobs) == 24 and d.prompt_logprobs[0] is None for d in outputs)
    assert [d.req_id for d in outputs] == sorted((d.req_id for d in outputs), key=int)
    assert time_to_first_token(model_dir, args).keys() == result.keys()
