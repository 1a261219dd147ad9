"""benchmarks/bench_sampler.py on CPU: every configuration through the Triton
kernels (interpreter) under each sampled-path variant draws the tokens the
code as it is draws, and outputs that differ are named."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from benchmarks import decode_variants
from benchmarks.bench_sampler import CONFIGS, differences, make_logits, time_variant
from tests.helpers.proc_utils import ROOT, run_in_session


@pytest.mark.timeout(300)
def test_every_variant_draws_the_default_tokens(tmp_path):
    out = tmp_path / "sampler.json"
    variants = ["default", *decode_variants.SAMPLER_VARIANTS]
    result, leftovers = run_in_session(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_sampler.py"), "--device", "cpu",
         "--dtype", "float32", "--vocab", "500", "--batches", "1", "3", "--iters", "2",
         "--kernels-on-cpu", "--variants", *variants, "--out", str(out)],
        timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    summary = json.loads(out.read_text())
    assert summary["problems"] == []
    assert [(r["config"], r["batch"]) for r in summary["rows"]] == [
        (name, batch) for name in CONFIGS for batch in (1, 3)]
    for row in summary["rows"]:
        assert list(row["variants"]) == variants
        assert all(v["outputs_equal"] and v["us_per_call"] > 0 for v in row["variants"].values())


def test_outputs_that_differ_are_named():
    # Greedy rows of reversed logits draw other tokens; scaled logits draw
    # the same argmax with other logprobs.
    logits = make_logits(2, 300, torch.float32, torch.device("cpu"))
    greedy_logprobs = dict(temperature=0.0, logprobs=2)
    _, want = time_variant(greedy_logprobs, 2, logits, 1, kernels_on_cpu=False)
    _, same = time_variant(greedy_logprobs, 2, logits.clone(), 1, kernels_on_cpu=False)
    assert differences(want, same) is None
    _, other = time_variant(greedy_logprobs, 2, -logits, 1, kernels_on_cpu=False)
    assert differences(want, other) == "call 0: tokens differ"
    _, scaled = time_variant(greedy_logprobs, 2, 1.05 * logits, 1, kernels_on_cpu=False)
    assert differences(want, scaled) == "call 0: logprobs differ"
    _, without = time_variant(CONFIGS["greedy"], 2, logits, 1, kernels_on_cpu=False)
    assert differences(want, without) == "call 0: logprobs on one side only"
