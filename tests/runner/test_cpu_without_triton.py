"""The CPU path needs no Triton: it neither imports it nor needs it installed.

A child process (TRITON_INTERPRET unset, as for a user on a CPU machine)
blocks every ``triton`` import, then generates with ``LLM`` on the CPU,
greedy and sampled. Its tokens must equal those of the same requests here,
where the test run may load Triton for its interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine import LLM, SamplingParams
from tests.helpers.proc_utils import ROOT, pythonpath

CHILD = """
import json, sys

class NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("triton is not installed here")

sys.meta_path.insert(0, NoTriton())
from engine import LLM, SamplingParams
prompts = [{"prompt_token_ids": [1, 2, 3]}, "hello"]
params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
          SamplingParams(temperature=0.8, seed=7, max_tokens=8, ignore_eos=True)]
with LLM(model="tiny", device="cpu") as llm:
    outs = llm.generate(prompts, params)
assert not any(m == "triton" or m.startswith("triton.") for m in sys.modules)
print(json.dumps([o.outputs[0].token_ids for o in outs]))
"""


@pytest.mark.timeout(120)
def test_cpu_generation_without_triton_matches(tmp_path, monkeypatch):
    # A CPU-only machine: no CUDA device visible, no interpreter asked for.
    env = dict(os.environ, PYTHONPATH=pythonpath(), TPRUN_CACHE=str(tmp_path),
               CUDA_VISIBLE_DEVICES="")
    env.pop("TRITON_INTERPRET", None)
    child = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=100)
    assert child.returncode == 0, child.stderr
    got = json.loads(child.stdout.splitlines()[-1])

    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path))
    params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=7, max_tokens=8, ignore_eos=True)]
    with LLM(model="tiny", device="cpu") as llm:
        outs = llm.generate([{"prompt_token_ids": [1, 2, 3]}, "hello"], params)
    assert got == [o.outputs[0].token_ids for o in outs]
