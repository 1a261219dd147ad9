"""The flash prefill path (runner/attention/flash_prefill.py) against the float32 oracle.

Which rows it takes is decided from host ints alone, tested here on any
device. The per-row SDPA kernel and the K/V gather run on CPU as well;
torch's ``varlen_attn`` is CUDA-only, so its numerics are tested on the GPU.
Rows the path does not take must still match the oracle (Triton kernels).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from runner.attention import flash_prefill
from runner.attention.flash_prefill import (
    FlashPrefillBackend,
    default_prefill_kernel,
    gather_rows_kv,
    leading_rows,
    prefill_suffix_start,
    varlen_attn_function,
)
from runner.attention.selector import get_attention_backend
from runner.attention.triton_kv_write import write_kv_cache
from runner.distributed import TensorParallelGroup
from tests.helpers.attention_oracle import (
    MIXED_QUERY_LENS,
    MIXED_SEQ_LENS,
    make_batch,
    run_and_check,
)
from tests.helpers.checkpoints import build_model_from_dir
from tests.helpers.kernel_device import KERNEL_DEVICE
from tests.helpers.model_parity import check_close, run_scenario, save_hf_model

CUDA = torch.cuda.is_available()
FRESH_LENS = [5, 16, 33, 1]  # a one-token prompt too, and a block boundary


def test_prefill_suffix_is_found_from_host_ints():
    last_is_one_token = make_batch(1, FRESH_LENS, FRESH_LENS, num_pad_tokens=3)
    assert prefill_suffix_start(last_is_one_token.attn, None) is None  # ends the suffix
    fresh = make_batch(1, [5, 16, 33], [5, 16, 33])
    assert prefill_suffix_start(fresh.attn, None) == 0
    assert prefill_suffix_start(fresh.attn, sliding_window=8) is None
    with_prefix = make_batch(2, [5, 16], [5, 40])
    assert prefill_suffix_start(with_prefix.attn, None) == 0
    after_a_decode = make_batch(3, [1, 16], [9, 16])
    assert prefill_suffix_start(after_a_decode.attn, None) == 1
    decodes = make_batch(4, [1, 1], [1, 30])
    assert prefill_suffix_start(decodes.attn, None) is None
    mixed = make_batch(5, MIXED_QUERY_LENS, MIXED_SEQ_LENS)  # 4 decodes, then 3, 11, 20, pad
    assert prefill_suffix_start(mixed.attn, None) == 4


def test_leading_rows_metadata():
    mixed = make_batch(6, MIXED_QUERY_LENS, MIXED_SEQ_LENS, num_pad_tokens=2)
    head = leading_rows(mixed.attn, 5)
    assert (head.num_reqs, head.num_tokens, head.num_decodes) == (5, 7, 4)
    assert (head.max_query_len, head.max_seq_len) == (3, 70)
    assert head.query_start_loc_cpu.tolist() == [0, 1, 2, 3, 4, 7]
    assert torch.equal(head.block_tables, mixed.attn.block_tables[:5])
    assert torch.equal(head.slot_mapping, mixed.attn.slot_mapping[:7])


def test_rows_kv_gathered_through_block_tables():
    batch = make_batch(6, MIXED_QUERY_LENS, MIXED_SEQ_LENS, num_pad_tokens=2, num_kv_heads=2)
    write_kv_cache(batch.k, batch.v, batch.kv_cache, batch.attn.slot_mapping)
    k, v, cu_seq_k = gather_rows_kv(batch.kv_cache, batch.attn, 4)
    assert cu_seq_k.tolist() == [0, 40, 90, 110, 110]
    block_size = batch.kv_cache.shape[2]
    for row, (start, end) in zip(range(4, 8), zip(cu_seq_k.tolist(), cu_seq_k.tolist()[1:])):
        for pos in range(end - start):
            block = int(batch.attn.block_tables[row, pos // block_size])
            for which, got in ((0, k), (1, v)):
                want = batch.kv_cache[which, block, pos % block_size]
                assert torch.equal(got[start + pos], want)


@pytest.mark.parametrize("num_q_heads,num_kv_heads,fused_qkv", [(4, 4, False), (8, 2, False),
                                                                (6, 2, True)])
def test_sdpa_path_matches_oracle(monkeypatch, num_q_heads, num_kv_heads, fused_qkv):
    calls = []
    real = flash_prefill.sdpa_prefill
    monkeypatch.setattr(flash_prefill, "sdpa_prefill", lambda *a: calls.append(1) or real(*a))
    lens = [5, 16, 33, 2]
    batch = make_batch(7, lens, lens, num_pad_tokens=4, head_dim=32,
                       num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, fused_qkv=fused_qkv)
    out = run_and_check(batch, FlashPrefillBackend(prefill_kernel="sdpa"), atol=1e-4)
    assert calls == [1]
    assert (out[batch.attn.num_tokens:] == 0).all()


def test_mixed_batch_splits_between_triton_and_sdpa(monkeypatch):
    """Decodes through Triton; the extends after cached prefixes and the fresh
    prompt through SDPA (bottom-right causal)."""
    calls = []
    real = flash_prefill.sdpa_prefill
    monkeypatch.setattr(flash_prefill, "sdpa_prefill",
                        lambda q, *a: calls.append(q.shape[0]) or real(q, *a))
    batch = make_batch(8, MIXED_QUERY_LENS, MIXED_SEQ_LENS, num_pad_tokens=5, head_dim=32,
                       num_q_heads=4, num_kv_heads=2)
    out = run_and_check(batch, FlashPrefillBackend(prefill_kernel="sdpa"), atol=1e-4)
    assert calls == [3 + 11 + 20]  # the decodes' tokens are not in it
    assert (out[batch.attn.num_tokens:] == 0).all()


def test_other_batches_take_the_triton_kernels(monkeypatch):
    def refuse(*args):
        raise AssertionError("no prefill rows, or a window: the SDPA path must not run")

    monkeypatch.setattr(flash_prefill, "sdpa_prefill", refuse)
    backend = FlashPrefillBackend(prefill_kernel="sdpa")
    decodes = make_batch(9, [1, 1, 1], [7, 5, 40], num_pad_tokens=2, head_dim=32,
                         num_q_heads=4, num_kv_heads=2)
    run_and_check(decodes, backend, atol=1e-4)
    window = make_batch(10, [20, 7], [20, 7], head_dim=32, num_q_heads=4, num_kv_heads=2)
    run_and_check(window, backend, atol=1e-4, window=6)


def test_selection_and_choices():
    backend = get_attention_backend("triton_flash_prefill", torch.device("cpu"))
    assert isinstance(backend, FlashPrefillBackend)
    assert default_prefill_kernel(torch.device("cpu")) == "triton"
    with pytest.raises(ValueError, match="prefill_kernel"):
        FlashPrefillBackend(prefill_kernel="flash")
    found = varlen_attn_function()
    if found is not None:  # FlashAttention is half precision: float32 takes SDPA
        batch = make_batch(11, [5, 9], [5, 9])
        backend = FlashPrefillBackend(prefill_kernel="varlen")
        scale = batch.q.shape[-1] ** -0.5
        assert backend.kernel_for(batch.q, batch.attn, scale, None) == ("sdpa", 0)
        assert backend.kernel_for(batch.q.bfloat16(), batch.attn, scale, None) == ("varlen", 0)
    if found is not None:  # the keywords we pass are this torch's
        params = inspect.signature(found.fn).parameters
        assert set(found.causal) <= set(params)
        assert found.takes_scale == ("scale" in params)
        assert found.takes_gqa == ("enable_gqa" in params)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, list[torch.Tensor]]]:
    root = tmp_path_factory.mktemp("flash_prefill_parity")
    return {name: (str(root / name), save_hf_model(name, str(root / name)))
            for name in ("llama", "llama3_tied", "qwen3")}


@pytest.mark.parametrize("name", ["llama", "llama3_tied", "qwen3"])
def test_model_with_flash_prefill_matches_hf(checkpoints, name, monkeypatch):
    """The whole model with the backend, against HF's logits: fresh prompts,
    chunks after a cached prefix (with padding tokens), then decodes."""
    calls = []
    real = flash_prefill.sdpa_prefill
    monkeypatch.setattr(flash_prefill, "sdpa_prefill", lambda *a: calls.append(1) or real(*a))
    model_dir, reference = checkpoints[name]
    model = build_model_from_dir(model_dir, torch.float32, KERNEL_DEVICE, TensorParallelGroup(),
                        "triton_flash_prefill")
    for layer in model.layers:  # float32: the SDPA kernel (FlashAttention is half precision)
        assert layer.self_attn.fused_kv_write
        layer.self_attn.backend.prefill_kernel = "sdpa"
    tol = 1e-4 if KERNEL_DEVICE.type == "cpu" else 1e-3
    check_close(run_scenario(model, 16, KERNEL_DEVICE), reference, tol=tol)
    assert len(calls) == 2 * model.config.num_hidden_layers  # both prefill steps


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch's flash kernels need CUDA")
@pytest.mark.parametrize("kernel", ["varlen", "sdpa"])
def test_flash_kernels_on_gpu_match_oracle(kernel):
    if kernel == "varlen" and varlen_attn_function() is None:
        pytest.skip("this torch has no torch.nn.attention.varlen")
    shape = {"block_size": 16, "head_dim": 128, "num_q_heads": 32, "num_kv_heads": 8,
             "dtype": torch.bfloat16}
    lens = [37, 300, 1000, 1]
    fresh = make_batch(11, lens, lens, num_pad_tokens=13, **shape)
    out = run_and_check(fresh, FlashPrefillBackend(prefill_kernel=kernel), atol=2e-2, rtol=2e-2)
    assert (out[fresh.attn.num_tokens:] == 0).all()
    # Decodes, then a chunk after a 4096-token cached prefix, then fresh prompts.
    mixed = make_batch(12, [1, 1, 300, 37, 1000], [17, 900, 4396, 37, 1000],
                       num_pad_tokens=7, **shape)
    out = run_and_check(mixed, FlashPrefillBackend(prefill_kernel=kernel), atol=2e-2, rtol=2e-2)
    assert (out[mixed.attn.num_tokens:] == 0).all()
