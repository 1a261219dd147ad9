"""vLLM's profiler: ``LLM(profiler_config={"profiler": "torch",
"torch_profiler_dir": DIR})``, ``start_profile()`` / ``stop_profile()``.

Each worker writes one gzipped Chrome trace named with its rank (vLLM's
``dp0_pp0_tp{T}_dcp0_ep0_rank{R}``) under DIR, holding the forward passes
it ran in between (``aten::mm``: the model's matmuls), and none of a
recording with no step in it; TP=2 (worker daemons over gloo) writes two.
Without a ``profiler_config`` both calls raise vLLM's message; a config
that asks for what tprun does not do is refused before any process starts
(``LLM`` and the CLI, one line)."""

from __future__ import annotations

import glob
import json
import os

import pytest

from engine import LLM, SamplingParams
from engine.config import ConfigError, EngineConfig
from tests.helpers.devices import DEVICES
from tests.helpers.proc_utils import run_tprun
from tests.helpers.profiler_traces import TRACE, names, traces

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def config(directory) -> dict:
    return {"profiler": "torch", "torch_profiler_dir": str(directory)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device", DEVICES)
def test_one_trace_per_step_window_holding_the_forward_passes(tiny_dir, tmp_path, device):
    with LLM(model=tiny_dir, device=device, profiler_config=config(tmp_path / "a")) as llm:
        llm.start_profile()
        out = llm.generate([{"prompt_token_ids": [1, 72, 105]}], PARAMS)
        llm.stop_profile()
        assert len(out[0].outputs[0].token_ids) == 4
        # A second recording with no step in it, under a prefix, in its own directory.
        empty = tmp_path / "a"
        before = set(traces(empty))
        llm.start_profile("idle")
        llm.stop_profile()
    found = traces(tmp_path / "a")
    assert len(before) == 1
    (busy,) = before
    (idle,) = set(found) - before
    assert TRACE.match(busy).group("prefix") is None
    assert TRACE.match(busy).group("tp", "rank") == ("0", "0")
    assert TRACE.match(idle).group("prefix") == "idle"
    # The forward passes: on the CPU their torch matmuls; on CUDA (Triton
    # kernels and replayed graphs, no aten::mm) the kernels the CUDA
    # activity records, which the CPU's trace never holds.
    kernels = {name: [e for e in events if e.get("cat") == "kernel"]
               for name, events in found.items()}
    if device == "cpu":
        assert "aten::mm" in names(found[busy])
        assert not kernels[busy]
    else:
        assert kernels[busy]
    assert "aten::mm" not in names(found[idle]) and not kernels[idle]
    # vLLM's operator table beside it (dump_cuda_time_total, on by default).
    table = (tmp_path / "a" / "profiler_out_0.txt").read_text()
    assert "Name" in table and "Self CPU" in table
    assert ("Self CUDA" in table) == (device == "cuda")


@pytest.mark.timeout(240)
def test_tp2_worker_daemons_write_one_trace_each(tiny_dir, tmp_path):
    directory = tmp_path / "tp2"
    with LLM(model=tiny_dir, device="cpu", tensor_parallel_size=2,
             profiler_config={**config(directory), "torch_profiler_with_stack": False,
                              "torch_profiler_dump_cuda_time_total": False}) as llm:
        llm.start_profile()
        llm.generate(["Hello"], PARAMS)
        llm.stop_profile()
    found = traces(directory)
    ranks = sorted(TRACE.match(name).group("tp", "rank") for name in found)
    assert ranks == [("0", "0"), ("1", "1")]
    for events in found.values():
        assert "aten::mm" in names(events)
    assert not glob.glob(str(directory / "profiler_out_*.txt"))


@pytest.mark.timeout(180)
def test_without_a_profiler_config_both_calls_raise_vllms_message(tiny_dir):
    with LLM(model=tiny_dir, device="cpu") as llm:
        for call in (llm.start_profile, llm.stop_profile):
            with pytest.raises(RuntimeError, match="^Profiling is not enabled. Please set "
                               "--profiler-config to enable profiling"):
                call()
        assert llm.generate(["Hi"], PARAMS)[0].outputs[0].token_ids  # still serving


@pytest.mark.parametrize("given, said", [
    ({"profiler": "cuda"}, "profiler 'cuda' is not supported"),
    ({"profiler": "torch"}, "torch_profiler_dir must be set when profiler is 'torch'"),
    ({"torch_profiler_dir": "/tmp/x"}, "torch_profiler_dir is only applicable"),
    ({"profiler": "torch", "torch_profiler_dir": "/tmp/x", "max_iterations": 3},
     "max_iterations 3 is not supported"),
    ({"profiler": "torch", "torch_profiler_dir": "/tmp/x", "record_shapes": True},
     r"unknown key\(s\) \['record_shapes'\]"),
    ({"profiler": "torch", "torch_profiler_dir": "/tmp/x",
      "torch_profiler_with_stack": "yes"}, "torch_profiler_with_stack must be true or false"),
    ("{not json", "profiler_config is not valid JSON"),
])
def test_refused_configs(given, said):
    with pytest.raises(ConfigError, match=said):
        EngineConfig(profiler_config=given)


def test_settings_reach_the_workers_config(tmp_path):
    given = {**config("~/traces"), "torch_profiler_record_shapes": True,
             "delay_iterations": 0, "active_iterations": 5}
    profiler = EngineConfig(profiler_config=json.dumps(given)).profiler
    assert profiler.torch_profiler_dir == os.path.expanduser("~/traces")
    assert profiler.torch_profiler_record_shapes is True
    assert profiler.torch_profiler_with_stack is True  # vLLM's default
    assert EngineConfig(profiler_config={"profiler": None}).profiler is None
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        EngineConfig(profiler_config=config(file)).check_machine()


@pytest.mark.timeout(60)
def test_cli_refuses_a_bad_config_in_one_line_before_starting(tmp_path):
    proc, leftovers = run_tprun(["serve", "--model", "tiny", "--device", "cpu", "--profiler-config",
                      '{"profiler": "cuda"}'], timeout=50)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and not leftovers
    assert lines == ["tprun: error: profiler_config: profiler 'cuda' is not supported (tprun "
                     "has 'torch', the torch profiler; null: off)"]
