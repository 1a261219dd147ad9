"""benchmarks/floor.py: bytes and FLOPs counted against HF's own model of the shape,
and the bandwidth measurement's fields."""

from __future__ import annotations

import pytest
import torch
import transformers

from benchmarks import floor
from benchmarks.shapes import SHAPES, hf_config, shape_config


def hf_model(tied: bool):
    config = hf_config("tiny")
    config.tie_word_embeddings = tied
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("tied", [False, True])
def test_decode_weight_bytes_count_one_embedding_row_per_token(tied):
    model = hf_model(tied)
    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    all_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # dedups tied
    row = embed.shape[1] * embed.element_size()
    got = floor.decode_weight_bytes(model.parameters(), embed, head, batch=3)
    if tied:  # the table is the LM head: read whole
        assert got == all_bytes
    else:
        assert got == all_bytes - embed.numel() * embed.element_size() + 3 * row


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_layer_matmul_params_match_hf(shape):
    """One decoder layer's projection weights, counted on HF's own layer."""
    config = {**shape_config(shape), "num_hidden_layers": 1, "vocab_size": 1000}
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "dtype")}
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    linears = [m for m in model.model.layers[0].modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 7
    assert floor.layer_matmul_params(config) == sum(m.weight.numel() for m in linears)


def test_prefill_flops_worked_by_hand():
    """3 layers of hidden 4, 2 query heads and 1 KV head of 2 dims,
    intermediate 6, vocabulary 10; 2 prompts of 3 tokens. A layer's
    projections: 4 x (4 + 2 + 2) + 4 x 4 + 3 x 4 x 6 = 120 weights, so
    2 x 3 x 120 x 6 tokens = 4320 FLOPs; the LM head once a prompt:
    2 x 10 x 4 x 2 = 160; attention: a prompt's tokens see 1 + 2 + 3 = 6
    keys, each costing q.k and p.v (2 x 2 FLOPs each) per query head:
    6 x 2 x 4 x 2 heads x 3 layers x 2 prompts = 576."""
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4, "intermediate_size": 6,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2,
              "num_hidden_layers": 3, "vocab_size": 10}
    assert floor.layer_matmul_params(config) == 120
    assert floor.prefill_flops(config, prompts=2, prompt_len=3) == 4320 + 160 + 576
    assert floor.prefill_flop_floor_s(5056, 1e-9) == pytest.approx(5.056)


def test_eight_b_prefill_floor():
    """32 x 2048 tokens at 8B: 32 layers of 218,103,808 projection weights
    for 65,536 tokens, 128,256 x 4,096 LM-head weights for 32 rows, and
    2,098,176 keys seen a prompt (2048 x 2049 / 2) x 32 heads x 128 dims x
    4 FLOPs, every layer and prompt."""
    config = shape_config("8b")
    assert floor.layer_matmul_params(config) == 218_103_808
    want = (2 * 32 * 218_103_808 * 65_536 + 2 * 128_256 * 4_096 * 32
            + 4 * 32 * 32 * 128 * 2_098_176 * 32)
    assert floor.prefill_flops(config, 32, 2048) == want
    assert floor.prefill_flop_floor_s(want, 787.1) == pytest.approx(1.2070, abs=1e-4)


def test_decode_floor_and_kv_bytes():
    kv = floor.kv_bytes_per_token(32, 8, 128, torch.bfloat16)
    assert kv == 2 * 32 * 8 * 128 * 2
    got = floor.decode_floor(10**9, kv, batch=4, context=1000, bandwidth={"used_GBps": 2000.0})
    # 1e9 + 4 x 1000 x 131072 = 1.524288e9 bytes; at 2 TB/s 0.762144 ms
    assert got == {"floor_ms": 0.7621, "floor_GB": 1.524}


def test_bandwidth_names_the_best_kernel():
    bw = floor.measure_bandwidth(torch.device("cpu"), nbytes=8 << 20)
    assert bw["read_triton_GBps"] is None  # CUDA only
    measured = {k: bw[f"{k}_GBps"] for k in ("read_sum", "copy")}
    assert all(v > 0 for v in measured.values())
    assert bw["used"] in measured and measured[bw["used"]] == max(measured.values())
    assert bw["used_GBps"] == measured[bw["used"]]


@pytest.mark.parametrize("config", [(64, 4, 1), (128, 2, 2)])
def test_triton_read_kernel_sums_every_element(config):
    """The read-only bandwidth kernel loads each element once: program i's
    partial sum is the plain torch sum of its slice (tail masked)."""
    from benchmarks import triton_read
    from tests.helpers.kernel_device import KERNEL_DEVICE

    block, loads, _ = config
    src = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    src = src.to(KERNEL_DEVICE)
    partial = triton_read.partial_sums(src, config)
    triton_read.read_all(src, partial, config)
    per_program = block * loads
    padded = torch.zeros(partial.numel() * per_program, dtype=torch.float32)
    padded[: src.numel()] = src.float().cpu()
    want = padded.view(-1, per_program).sum(dim=1)
    torch.testing.assert_close(partial.cpu(), want, atol=1e-3, rtol=1e-4)


def test_sustained_matmul_rate_times_calls_after_as_many_warm(monkeypatch):
    """``sustain_s``: after the burst (here 0.01 s a call), 0.5 s of calls
    run untimed and 0.5 s of calls timed; the rate comes from the timed
    ones. The burst alone is the default."""
    calls = []

    def fake_time_per_call(fn, device, iters=10, warmup=3):
        calls.append((iters, warmup))
        return 0.01 if len(calls) == 1 else 0.0125

    monkeypatch.setattr(floor, "time_per_call", fake_time_per_call)
    n = 64
    burst, held = floor.matmul_tflops(torch.device("cpu"), n, torch.float32)
    assert burst == pytest.approx(2 * n**3 / 0.01 / 1e12) and held is None
    assert calls == [(2, 3)]
    calls.clear()
    burst, held = floor.matmul_tflops(torch.device("cpu"), n, torch.float32, sustain_s=0.5)
    assert burst == pytest.approx(2 * n**3 / 0.01 / 1e12)
    assert held == pytest.approx(2 * n**3 / 0.0125 / 1e12)
    assert calls == [(2, 3), (50, 50)]
