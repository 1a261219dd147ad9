"""benchmarks/bench_decode.py on CPU (tiny shape, float32): tprun and the
torch.compile peer timed on every row, the floor recomputed here from the
shape's dimensions."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys

import pytest
import torch

from ipc.messages import SamplingOptions
from tests.helpers.proc_utils import ROOT, run_in_session

# The tiny shape (benchmarks/shapes.py), float32: hidden 128, intermediate 256,
# 2 layers, 4 query heads, 2 KV heads of 32, vocabulary 512, untied head.
LAYER_PARAMS = 128 * (128 + 2 * 64) + 128 * 128 + 3 * 128 * 256 + 2 * 128
NON_EMBEDDING_PARAMS = 2 * LAYER_PARAMS + 128 + 512 * 128
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4


def run_bench(out, *args: str):
    """One run on CPU; compiled code is cached beside ``out``, not in /tmp."""
    result, leftovers = run_in_session(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_decode.py"), "--shape", "tiny",
         "--device", "cpu", "--dtype", "float32", "--batches", "2", "--steps", "3",
         "--bandwidth-mib", "16", "--out", str(out), *args], timeout=380,
        env={"TORCHINDUCTOR_CACHE_DIR": str(out.parent / "inductor")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers == []
    summary = json.loads(out.read_text())
    assert summary == json.loads(result.stdout.strip().splitlines()[-1])
    return summary


def check_floor(row: dict) -> None:
    """The floor from the shape's dimensions: weights without the embedding
    table, one row of it per request, the batch's KV."""
    read = 4 * NON_EMBEDDING_PARAMS + 2 * 128 * 4 + 2 * row["context"] * KV_BYTES_PER_TOKEN
    assert row["floor_GB"] == pytest.approx(read / 1e9, abs=1e-3)
    # floor_ms is written to 4 decimals: on CPU it is a few hundredths of a
    # millisecond, so the rounding alone can exceed a relative tolerance.
    assert row["floor_ms"] == pytest.approx(read / (row["floor_GBps"] * 1e6), rel=2e-3,
                                            abs=5e-5)
    assert row["ratio_to_floor"] == pytest.approx(row["step_ms"] / row["floor_ms"], rel=1e-2)
    # The step time is the median of the row's timed rounds (--rounds, 3).
    assert len(row["step_ms_rounds"]) == 3
    assert row["step_ms"] == statistics.median(row["step_ms_rounds"])


@pytest.mark.slow
@pytest.mark.timeout(800)
def test_decode_rows_hold_tprun_peer_and_floor(tmp_path):
    out = tmp_path / "decode.json"
    summary = run_bench(out, "--contexts", "24", "--peer")
    bandwidth = summary["bandwidth"]
    assert bandwidth["used"] in ("read_sum", "copy") and bandwidth["read_triton_GBps"] is None
    assert bandwidth["used_GBps"] == max(bandwidth["read_sum_GBps"], bandwidth["copy_GBps"])
    assert summary["peer"]["compile"] == {"mode": "reduce-overhead", "fullgraph": True,
                                          "dynamic": False}
    (row,) = summary["results"]
    assert (row["batch"], row["context"], row["floor_GBps"]) == (2, 24, bandwidth["used_GBps"])
    check_floor(row)
    assert row["eager_check"] == {"steps": 8, "tokens_equal": True}
    assert row["norms_in_matmuls"] is True  # the torch references carry them at TP=1
    assert summary["problems"] == []
    assert row["peer_step_ms"] > 0
    assert row["tprun_to_peer"] == pytest.approx(row["step_ms"] / row["peer_step_ms"], rel=1e-2,
                                                abs=5e-4)
    assert row["peer_ratio_to_floor"] == pytest.approx(row["peer_step_ms"] / row["floor_ms"],
                                                       rel=1e-2)
    # A second run of another context, appended: both rows, each with its own floor.
    merged = run_bench(out, "--contexts", "40", "--append")
    first, second = merged["results"]
    assert first == row
    assert (second["context"], "peer_step_ms" in second) == (40, False)
    check_floor(second)


def test_cublas_only_replaces_the_layers_ops_not_the_devices():
    """--cublas-only gives each row-parallel layer F.linear, each module that
    projects gate/up or qkv the cuBLAS-then-kernel pair, and leaves every
    other op, and the device's shared DeviceOps, as they were."""
    import torch.nn.functional as F

    from benchmarks.bench_decode import use_cublas_everywhere
    from runner.distributed import TensorParallelGroup
    from runner.layers.linear import RowParallelLinear
    from runner.layers.rotary import RotaryEmbedding
    from runner.layers.triton_qkv_rotary import unfused_qkv_rotary_write_kv
    from runner.layers.triton_skinny_matmul import cublas_gate_up_silu
    from runner.ops import device_ops

    tp = TensorParallelGroup(rank=0, size=1, peer=None)
    model = torch.nn.Sequential(RowParallelLinear(8, 4, tp, False, torch.float32),
                                RowParallelLinear(4, 8, tp, False, torch.float32),
                                RotaryEmbedding(8, 16, 10000.0, None))
    shared = device_ops(torch.device("cpu"))
    sentinel = object()
    for layer in model:  # a stand-in for the device's own choice, to see it replaced
        layer.ops = dataclasses.replace(layer.ops, row_parallel_matmul=sentinel,
                                        gate_up_silu=sentinel, qkv_rotary_write_kv=sentinel)
    use_cublas_everywhere(model)
    for layer in model:
        assert layer.ops.row_parallel_matmul is F.linear
        assert layer.ops.gate_up_silu is cublas_gate_up_silu
        qkv = layer.ops.qkv_rotary_write_kv
        assert (qkv.func, qkv.args) == (unfused_qkv_rotary_write_kv, (F.linear,))
        assert layer.ops.rms_norm is shared.rms_norm
    assert device_ops(torch.device("cpu")) is shared


def test_cublas_only_launches_the_norms_on_their_own():
    """The model's decision to carry the norms in the matmuls follows its
    ops: after --cublas-only's replacement no size carries them, also a
    size asked before."""
    from benchmarks.bench_decode import use_cublas_everywhere
    from checkpoint.description import from_hf_dict
    from runner.distributed import TensorParallelGroup
    from runner.models import build_model_from_config
    from tests.runner.test_loader import HF_CONFIG

    model = build_model_from_config(from_hf_dict(HF_CONFIG), torch.float32,
                                    torch.device("cpu"), TensorParallelGroup())
    assert model.carries_norms(4)
    use_cublas_everywhere(model)
    assert not model.carries_norms(4) and not model.carries_norms(5)


@pytest.mark.slow
@pytest.mark.timeout(800)
def test_spec_rows_verify_cost_and_replay_acceptance(tmp_path):
    """--spec-tokens: each row gains spec[k] with the (1 + k)-token step; the
    replay proposer keeps every draft right at --replay-accept 1 (k + 1
    tokens a step) and none at 0 (one)."""
    rows = {}
    for accept in ("1", "0"):
        out = tmp_path / f"decode_{accept}.json"
        summary = run_bench(out, "--contexts", "24", "--spec-tokens", "2",
                            "--replay-accept", accept)
        (rows[accept],) = summary["results"]
    for accept, want in (("1", 3.0), ("0", 1.0)):
        spec = rows[accept]["spec"]["2"]
        assert spec["proposer"] == "replay" and spec["replay_accept"] == float(accept)
        assert spec["tokens_per_step"] == pytest.approx(want)
        assert spec["verify_cost"] == pytest.approx(spec["step_ms"] / rows[accept]["step_ms"],
                                                    rel=1e-2)
        assert spec["ms_per_output_token"] == pytest.approx(spec["step_ms"] / want, rel=1e-2)


# Bytes of one tiny-shape adapter at rank 8 in float32: r * (in + out) for
# q, k, v, o, gate, up and down, in 2 layers.
ADAPTER_BYTES = 4 * 8 * 2 * ((128 + 128) + 2 * (128 + 64) + (128 + 128) + 3 * (128 + 256))


@pytest.mark.slow
@pytest.mark.timeout(800)
def test_lora_rows_against_plain_rows_in_one_run(tmp_path):
    """--max-loras 2 --max-lora-rank 8: batch 2 runs both adapters; its
    floor adds both adapters' bytes; the same row without LoRA is timed in
    the same run; every row's timed tokens equal eager steps'."""
    summary = run_bench(tmp_path / "decode.json", "--contexts", "24", "--max-loras", "2",
                        "--max-lora-rank", "8")
    (row,) = summary["results"]
    assert summary["lora"]["max_loras"] == 2 and summary["lora"]["max_lora_rank"] == 8
    assert row["eager_check"]["tokens_equal"] and row["plain"]["eager_check"]["tokens_equal"]
    assert row["lora_over_plain"] == pytest.approx(row["step_ms"] / row["plain"]["step_ms"],
                                                   rel=1e-3)
    adapters_ms = 2 * ADAPTER_BYTES / (row["floor_GBps"] * 1e6)
    assert row["floor_ms"] - row["plain"]["floor_ms"] == pytest.approx(adapters_ms, abs=2e-4)


@pytest.mark.parametrize("batch", [1, 3])
def test_eager_check_compares_graph_steps_with_eager_ones(tmp_path, monkeypatch, batch):
    """The row check: replays of the (emulated) decode graphs give the eager
    steps' tokens; a replay that returns other tokens is caught, and the
    graphs are back in place after each eager run. (A one-row graph draws
    its greedy tokens inside, a larger one leaves the draw to the sampler.)"""
    from benchmarks.bench_decode import eager_check
    from checkpoint.tiny_model import ensure_tiny_model
    from tests.helpers.runner_steps import make_runner

    runner = make_runner(ensure_tiny_model(str(tmp_path)), emulate_graphs=True)
    graphs = runner.graphs
    assert eager_check(runner, batch=batch, context=20) == {"steps": 8, "tokens_equal": True}
    assert runner.graphs is graphs and graphs.graphs

    replay = graphs.replay

    def shifted(size):  # every row's logits and argmax moved by one token
        tensors = replay(size)
        tensors.logits.copy_(tensors.logits.roll(1, dims=-1))
        if tensors.greedy is not None:
            tensors.greedy.copy_((tensors.greedy + 1) % tensors.logits.shape[-1])
        return tensors

    monkeypatch.setattr(graphs, "replay", shifted)
    assert eager_check(runner, batch=batch, context=20) == {"steps": 8, "tokens_equal": False}
    assert runner.graphs is graphs and graphs.graphs


def test_variants_are_captured_and_timed_each_under_its_own_settings(tmp_path, monkeypatch):
    """--variants: every round runs each variant (in reverse order every
    other round) with the graphs captured while its attributes are set; each
    row holds every variant's rounds, median, ratio to the first and check
    against eager steps; the attributes are back after each variant, and the
    default graphs are captured last."""
    import argparse
    import types

    from benchmarks import decode_variants
    from benchmarks.bench_decode import variant_rows
    from checkpoint.tiny_model import ensure_tiny_model
    from tests.helpers.runner_steps import make_runner

    knob = types.ModuleType("knob")
    knob.value = "as built"
    monkeypatch.setitem(sys.modules, "knob", knob)
    monkeypatch.setitem(decode_variants.VARIANTS, "turned",
                        decode_variants.Variant("a test knob", (("knob", "value", "turned"),)))
    runner = make_runner(ensure_tiny_model(str(tmp_path)), emulate_graphs=True)
    captured = []
    capture = runner.capture_graphs

    def spy():
        captured.append(knob.value)
        capture()
    monkeypatch.setattr(runner, "capture_graphs", spy)
    args = argparse.Namespace(variants=["default", "turned"], rounds=3, steps=2, shape="tiny",
                              batches=[1, 3], contexts=[20], timeline=False,
                              temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                              repetition_penalty=1.0, logprobs=None)
    rows = variant_rows(args, runner, lambda batch, context: {"floor_ms": 1.0, "floor_GB": 0.0,
                                                              "floor_GBps": 1.0},
                        runner.num_blocks, show=False)
    assert captured == ["as built", "turned", "turned", "as built", "as built", "turned",
                        "as built"]
    assert knob.value == "as built"
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 20), (3, 20)]
    for row in rows:
        first, turned = row["variants"]["default"], row["variants"]["turned"]
        assert len(first["step_ms_rounds"]) == len(turned["step_ms_rounds"]) == 3
        assert row["step_ms"] == first["step_ms"] == statistics.median(first["step_ms_rounds"])
        assert first["over_first"] == 1.0
        # over_first is written to 4 decimals
        assert turned["over_first"] == pytest.approx(turned["step_ms"] / first["step_ms"],
                                                     rel=1e-3, abs=6e-5)
        assert first["tokens_equal"] and turned["tokens_equal"]
        assert row["eager_check"] == {"steps": 8, "tokens_equal": True}


def test_every_listed_variant_names_attributes_that_exist():
    """A variant whose module or attribute is gone would set a new name
    that nothing reads: each one's targets exist, and ``applied`` puts
    them back."""
    import importlib

    from benchmarks import decode_variants

    for name, variant in decode_variants.VARIANTS.items():
        before = []
        for module_name, attribute, _ in variant.patches:
            module = importlib.import_module(module_name)
            assert hasattr(module, attribute), (name, module_name, attribute)
            before.append(getattr(module, attribute))
        with decode_variants.applied(name):
            for (module_name, attribute, value) in variant.patches:
                assert getattr(importlib.import_module(module_name), attribute) == value
        after = [getattr(importlib.import_module(m), a) for m, a, _ in variant.patches]
        assert after == before


def test_variants_refuse_the_options_that_time_other_things(capsys):
    import argparse

    from benchmarks.bench_decode import check_args

    parser = argparse.ArgumentParser()
    base = dict(device="cuda", idle=False, kernel_table=False, timeline=False, peer=False,
                profile_host=False, spec_tokens=[], cublas_only=False, temperature=0.0,
                top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0, logprobs=None,
                max_loras=0, max_lora_rank=16)
    check_args(parser, argparse.Namespace(**base, variants=["default"]))
    with pytest.raises(SystemExit):
        check_args(parser, argparse.Namespace(**{**base, "peer": True}, variants=["default"]))
    assert "--variants times plain rows only" in capsys.readouterr().err
    check_args(parser, argparse.Namespace(**{**base, "temperature": 1.0}, variants=None))
    for other in ({"peer": True}, {"spec_tokens": [2]}):
        with pytest.raises(SystemExit):
            check_args(parser, argparse.Namespace(**{**base, "temperature": 1.0, **other},
                                                  variants=None))
        assert "--temperature samples plain rows only" in capsys.readouterr().err
    check_args(parser, argparse.Namespace(**{**base, "temperature": 1.0, "top_p": 0.9},
                                          variants=None))
    check_args(parser, argparse.Namespace(**{**base, "repetition_penalty": 1.2},
                                          variants=None))  # greedy rows penalise too
    check_args(parser, argparse.Namespace(**{**base, "max_loras": 4}, variants=["default"]))
    for bad, message in (({"top_p": 0.9}, "give --temperature"),
                         ({"min_p": 0.1}, "give --temperature"),
                         ({"max_loras": 2, "spec_tokens": [2]}, "--max-loras times plain"),
                         ({"max_loras": -1}, "--max-loras must be"),
                         # the engine's ranks (vLLM's) only, refused before any row runs
                         ({"max_loras": 2, "max_lora_rank": 4},
                          "--max-lora-rank must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512"),
                         ({"temperature": 1.0, "top_p": 1.5}, "top_p")):
        with pytest.raises(SystemExit):
            check_args(parser, argparse.Namespace(**{**base, **bad}, variants=None))
        assert message in capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batch", [1, 3])
def test_sampled_rows_draw_seeded_tokens_that_the_check_compares(tmp_path, batch):
    """--temperature: each request samples at it with a seed of its own, so
    graph replays (a one-row graph's argmax then unused) and eager steps
    draw the same tokens, and those tokens leave the greedy ones; with
    --top-k 1 (the filters' path) they are the greedy ones again."""
    from benchmarks.bench_decode import DecodeDriver, eager_check
    from benchmarks.spec_rows import row_tokens
    from checkpoint.tiny_model import ensure_tiny_model
    from tests.helpers.runner_steps import make_runner

    runner = make_runner(ensure_tiny_model(str(tmp_path)), emulate_graphs=True)
    hot = SamplingOptions(temperature=2.0)
    driver = DecodeDriver(runner, hot)
    driver.start(batch, 20, 4)
    assert [(r.sampling.temperature, r.sampling.seed) for r in driver.pending_new] == [
        (2.0, i) for i in range(batch)]
    assert eager_check(runner, batch, 20, hot) == {"steps": 8, "tokens_equal": True}
    sampled = row_tokens(DecodeDriver(runner, hot), runner, batch, 20, 8, kv_seed=5)
    greedy = row_tokens(DecodeDriver(runner), runner, batch, 20, 8, kv_seed=5)
    assert sampled == row_tokens(DecodeDriver(runner, hot), runner, batch, 20, 8, kv_seed=5)
    assert sampled != greedy
    top1 = SamplingOptions(temperature=2.0, top_k=1)
    assert eager_check(runner, batch, 20, top1) == {"steps": 8, "tokens_equal": True}
    penalised = SamplingOptions(temperature=2.0, min_p=0.05, repetition_penalty=1.3)
    assert eager_check(runner, batch, 20, penalised) == {"steps": 8, "tokens_equal": True}
    with_logprobs = SamplingOptions(temperature=2.0, top_p=0.9, logprobs=3)
    assert eager_check(runner, batch, 20, with_logprobs) == {"steps": 8, "tokens_equal": True}
    assert row_tokens(DecodeDriver(runner, top1), runner, batch, 20, 8, kv_seed=5) == greedy


@pytest.mark.timeout(400)
def test_block_size_sets_the_runners_kv_blocks(tmp_path):
    """--block-size: the runner's cache takes blocks of that many tokens, so a
    row's requests need half as many blocks of 32 as of 16, and the timed
    tokens still equal eager steps'."""
    from benchmarks.bench_decode import plain_row_steps

    out = tmp_path / "decode.json"
    summary = run_bench(out, "--contexts", "40", "--block-size", "32")
    steps = plain_row_steps(type("Args", (), {"rounds": 3, "steps": 3})())
    assert summary["block_size"] == 32
    # Two requests of 40 context tokens, the steps' tokens and a margin of 36.
    assert summary["num_blocks"] == 2 * -(-(40 + steps + 36) // 32)
    (row,) = summary["results"]
    check_floor(row)
    assert row["eager_check"] == {"steps": 8, "tokens_equal": True}
