"""Fresh prompts attended through torch's SDPA on their own k and v
(runner/attention/fresh_prefill.py, taken by the Triton backend), against the
float32 oracle and, for the whole model, HF's logits."""

from __future__ import annotations

import pytest
import torch

from runner.attention import fresh_prefill
from runner.attention.fresh_prefill import equal_length_runs, fresh_suffix_start
from runner.attention.triton_attn import TritonAttentionBackend
from runner.attention.triton_kv_write import write_kv_cache
from runner.distributed import TensorParallelGroup
from tests.helpers.attention_oracle import dense_reference, expected_cache, make_batch
from tests.helpers.checkpoints import build_model_from_dir
from tests.helpers.kernel_device import KERNEL_DEVICE
from tests.helpers.model_parity import check_close, run_scenario, save_hf_model


def test_fresh_suffix_is_found_from_host_ints():
    fresh = make_batch(1, [20, 24, 24], [20, 24, 24])
    assert fresh_suffix_start(fresh.attn, 16, None) == 0
    assert fresh_suffix_start(fresh.attn, 21, None) == 1  # 20 tokens: below the minimum
    assert fresh_suffix_start(fresh.attn, 16, sliding_window=8) is None
    prefix_last = make_batch(2, [1, 20, 24], [9, 20, 40])  # the last row has a cached prefix
    assert fresh_suffix_start(prefix_last.attn, 16, None) is None
    after_decodes = make_batch(3, [1, 1, 3, 20], [9, 5, 30, 20])
    assert fresh_suffix_start(after_decodes.attn, 16, None) == 3
    decodes = make_batch(4, [1, 1], [7, 30])
    assert fresh_suffix_start(decodes.attn, 1, None) is None  # seq_len != query_len


def test_equal_length_runs():
    assert equal_length_runs([0, 24, 48, 72]) == [(0, 3, 24)]
    assert equal_length_runs([10, 30, 54, 78, 111]) == [(10, 1, 20), (30, 2, 24), (78, 1, 33)]


def _attend(batch, min_tokens):
    """The model's order: the rotary kernel stores k and v, then attend with
    the step's own k and v where the backend wants them."""
    backend = TritonAttentionBackend(fresh_prefill_min_tokens=min_tokens)
    scale = batch.q.shape[-1] ** -0.5
    want_cache = expected_cache(batch)
    want = dense_reference(batch, want_cache, scale)
    write_kv_cache(batch.k, batch.v, batch.kv_cache, batch.attn.slot_mapping)
    fresh = backend.wants_fresh_kv(batch.attn, None)
    out = backend.attend(batch.q, batch.kv_cache, batch.attn, scale,
                         fresh_kv=(batch.k, batch.v) if fresh else None)
    assert out.shape == batch.q.shape
    torch.testing.assert_close(out.float(), want, atol=1e-4, rtol=0)
    return fresh


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(4, 1), (4, 4)])
def test_fresh_rows_match_the_oracle(monkeypatch, num_q_heads, num_kv_heads):
    """Decodes, a chunk after a cached prefix, then fresh prompts of two
    lengths (two batched SDPA calls) and padding tokens; and a batch of
    equal fresh prompts only (one call, its output returned as laid out)."""
    calls = []
    real = fresh_prefill.attend_fresh_rows
    monkeypatch.setattr("runner.attention.triton_attn.attend_fresh_rows",
                        lambda *a: calls.append(a[3]) or real(*a))
    mixed = make_batch(5, [1, 1, 3, 20, 24, 24], [9, 33, 40, 20, 24, 24], num_pad_tokens=3,
                       num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, fused_qkv=True)
    assert _attend(mixed, 16)
    assert calls == [[5, 25, 49, 73]]  # the fresh rows' token offsets
    equal = make_batch(6, [24, 24, 24], [24, 24, 24], num_q_heads=num_q_heads,
                       num_kv_heads=num_kv_heads)
    assert _attend(equal, 16)
    short = make_batch(7, [1, 12], [9, 12], num_q_heads=num_q_heads, num_kv_heads=num_kv_heads)
    assert not _attend(short, 16)  # below the minimum: the Triton kernels alone
    assert len(calls) == 2


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory) -> tuple[str, list[torch.Tensor]]:
    root = str(tmp_path_factory.mktemp("fresh_prefill_parity") / "llama")
    return root, save_hf_model("llama", root)


def test_model_with_fresh_prefill_matches_hf(llama_checkpoint, monkeypatch):
    """The whole model with the Triton backend and a low minimum, against
    HF's logits: fresh prompts take SDPA on their rotated k (left in place by
    the rotary kernel), later chunks and decodes the Triton kernels."""
    calls = []
    real = fresh_prefill.attend_fresh_rows
    monkeypatch.setattr("runner.attention.triton_attn.attend_fresh_rows",
                        lambda *a: calls.append(1) or real(*a))
    model_dir, reference = llama_checkpoint
    model = build_model_from_dir(model_dir, torch.float32, KERNEL_DEVICE, TensorParallelGroup(),
                                 "triton")
    for layer in model.layers:
        assert layer.self_attn.fused_kv_write
        layer.self_attn.backend.fresh_prefill_min_tokens = 4
    tol = 1e-4 if KERNEL_DEVICE.type == "cpu" else 1e-3
    check_close(run_scenario(model, 16, KERNEL_DEVICE), reference, tol=tol)
    assert calls and len(calls) % model.config.num_hidden_layers == 0
