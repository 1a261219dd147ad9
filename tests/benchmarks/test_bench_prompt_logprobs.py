"""benchmarks/bench_prompt_logprobs.py: the check of the scored run against
the plain one (hand-made deltas), and the runs' outputs on CPU (tiny shape)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.bench_e2e import time_to_first_token
from benchmarks.bench_prompt_logprobs import scored_differences
from engine.outputs import Logprob, RequestOutputDelta


def _delta(req_id, token, prompt_logprobs=None):
    return RequestOutputDelta(req_id, [token], True, "length", prompt_logprobs=prompt_logprobs)


def test_scored_differences_names_what_differs():
    plain = [_delta("a", 5), _delta("b", 7)]
    entries = [None, {3: Logprob(-0.5, 1)}, {4: Logprob(-1.0, 2)}]
    assert scored_differences(plain, [_delta("a", 5, entries), _delta("b", 7, entries)]) == []
    assert scored_differences(plain, [_delta("a", 6, entries), _delta("b", 7, entries)]) == [
        "prompt 0: first token [6] != [5]"]
    holed = [None, None, {4: Logprob(-1.0, 2)}]
    assert scored_differences(plain, [_delta("a", 5, entries), _delta("b", 7, holed)]) == [
        "prompt 1: no prompt logprobs at positions [1]"]
    assert scored_differences(plain, [_delta("a", 5), _delta("b", 7, entries)]) == [
        "prompt 0: no prompt logprobs at positions all"]


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
