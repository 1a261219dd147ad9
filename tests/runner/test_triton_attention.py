"""Triton paged attention and KV write against a plain-torch dense oracle.

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py), so shapes
stay small. The oracle (tests/helpers/attention_oracle.py) is independent of
the kernels: it writes the expected cache with torch indexing, gathers each
request's keys and values through its block table, and runs causal softmax
attention in float32.
"""

from __future__ import annotations

import pytest
import torch

from runner.attention.metadata import AttentionMetadata
from runner.attention.triton_attn import (
    MAX_SPLIT_QUERY_LEN,
    TritonAttentionBackend,
    choose_num_splits,
    tile_config,
)
from runner.attention.triton_kv_write import write_kv_cache
from tests.helpers.attention_oracle import (
    MIXED_QUERY_LENS,
    MIXED_SEQ_LENS,
    Batch,
    dense_reference,
    expected_cache,
    make_batch,
    run_and_check,
)
from tests.helpers.kernel_device import KERNEL_DEVICE

CUDA = torch.cuda.is_available()
DEVICE = KERNEL_DEVICE


@pytest.mark.parametrize(
    "block_size,head_dim,num_q_heads,num_kv_heads",
    [
        (16, 64, 2, 2),  # MHA (GQA ratio 1)
        (32, 128, 4, 1),  # GQA 4
        (16, 128, 8, 1),  # GQA 8
        (32, 64, 8, 2),  # GQA 4, two KV heads
        (8, 32, 6, 2),  # GQA 3 (not a power of two), block size 8
        (16, 48, 4, 2),  # head dim padded to 64 inside the kernels
    ],
)
def test_mixed_batch_matches_oracle(block_size, head_dim, num_q_heads, num_kv_heads):
    batch = make_batch(
        block_size + head_dim + num_q_heads,
        MIXED_QUERY_LENS,
        MIXED_SEQ_LENS,
        num_pad_tokens=5,
        block_size=block_size,
        head_dim=head_dim,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
    )
    out = run_and_check(batch, TritonAttentionBackend(), atol=1e-4)
    assert (out[batch.attn.num_tokens :] == 0).all()


@pytest.mark.parametrize("num_splits", [2, 5])
@pytest.mark.parametrize("decode_only", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_split_kv_matches_oracle(num_splits, decode_only):
    if decode_only:
        query_lens, seq_lens = [1, 1, 1, 1, 0], [3, 40, 127, 130, 0]
    else:
        query_lens, seq_lens = MIXED_QUERY_LENS, MIXED_SEQ_LENS
    batch = make_batch(
        7 + num_splits, query_lens, seq_lens, num_pad_tokens=3, block_size=16,
        head_dim=64, num_q_heads=8, num_kv_heads=2,
    )
    out = run_and_check(batch, TritonAttentionBackend(num_splits=num_splits), atol=1e-4)
    assert (out[batch.attn.num_tokens :] == 0).all()


@pytest.mark.parametrize("num_splits,window", [(1, None), (4, None), (3, 40)])
def test_uniform_decode_batch_matches_oracle(num_splits, window):
    """Every row one query token: the kernel maps token r to row r without
    searching query_start_loc and loads values with keys; the padding tokens
    past the rows give zeros."""
    batch = make_batch(23, [1, 1, 1, 1], [1, 33, 130, 257], num_pad_tokens=3, block_size=16,
                       head_dim=64, num_q_heads=8, num_kv_heads=2)
    assert batch.attn.uniform_decode
    out = run_and_check(batch, TritonAttentionBackend(num_splits=num_splits), atol=1e-4,
                        window=window)
    assert (out[batch.attn.num_tokens :] == 0).all()


# Long enough rows that a window skips whole key tiles (64 and 128 keys).
WINDOW_QUERY_LENS = [1, 1, 1, 5, 40, 0]
WINDOW_SEQ_LENS = [9, 150, 300, 140, 260, 0]


@pytest.mark.parametrize("window", [1, 6, 64, 100, 1000])
@pytest.mark.parametrize("num_splits", [1, pytest.param(3, marks=pytest.mark.slow), None])
def test_sliding_window_matches_oracle(window, num_splits):
    batch = make_batch(
        window + 11, WINDOW_QUERY_LENS, WINDOW_SEQ_LENS, num_pad_tokens=2, block_size=16,
        head_dim=64, num_q_heads=4, num_kv_heads=2,
    )
    out = run_and_check(batch, TritonAttentionBackend(num_splits=num_splits), atol=1e-4,
                        window=window)
    assert (out[batch.attn.num_tokens :] == 0).all()


@pytest.mark.parametrize("window", [1, 6, 100])
def test_torch_reference_sliding_window_matches_oracle(window):
    from runner.attention.torch_ref import TorchAttentionBackend

    batch = make_batch(window, WINDOW_QUERY_LENS, WINDOW_SEQ_LENS, num_pad_tokens=2,
                       block_size=16, head_dim=32, num_q_heads=4, num_kv_heads=2)
    run_and_check(batch, TorchAttentionBackend(), atol=1e-5, window=window)


def test_split_and_plain_paths_agree():
    batch = make_batch(3, [1, 1, 4], [90, 200, 64], head_dim=64, num_q_heads=4, num_kv_heads=2)
    scale = 0.125
    cache = batch.kv_cache.clone()
    plain = TritonAttentionBackend(num_splits=1).forward(
        batch.q, batch.k, batch.v, cache, batch.attn, scale
    )
    split = TritonAttentionBackend(num_splits=4).forward(
        batch.q, batch.k, batch.v, batch.kv_cache, batch.attn, scale
    )
    torch.testing.assert_close(split, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_graph_style_padding_rows_give_zeros(num_splits):
    """Padded decode rows (one query token, seq_len 0, slot -1) give zeros, not NaN."""
    batch = make_batch(11, [1, 1, 1, 1], [17, 64, 1, 1], head_dim=64, num_q_heads=4,
                       num_kv_heads=1)
    seq_lens = batch.attn.seq_lens.clone()
    seq_lens[2:] = 0
    slots = batch.attn.slot_mapping.clone()
    slots[2:] = -1
    attn = AttentionMetadata(
        num_reqs=4, num_tokens=4, num_decodes=4, max_query_len=1, max_seq_len=64,
        query_start_loc=batch.attn.query_start_loc, seq_lens=seq_lens,
        block_tables=batch.attn.block_tables, slot_mapping=slots,
        query_start_loc_cpu=batch.attn.query_start_loc_cpu, seq_lens_cpu=seq_lens.cpu(),
    )
    padded = Batch(batch.q, batch.k, batch.v, batch.kv_cache, attn, [1, 1, 0, 0], [17, 64, 0, 0])
    out = run_and_check(padded, TritonAttentionBackend(num_splits=num_splits), atol=1e-4)
    assert (out[2:] == 0).all()


def test_kv_write_skips_padding_and_handles_strided_inputs():
    batch = make_batch(5, [1, 6, 0], [9, 30, 0], num_pad_tokens=4, block_size=16,
                       head_dim=32, num_q_heads=4, num_kv_heads=2, fused_qkv=True)
    assert not batch.k.is_contiguous()
    want = expected_cache(batch)
    before = batch.kv_cache.clone()
    write_kv_cache(batch.k, batch.v, batch.kv_cache, batch.attn.slot_mapping)
    assert torch.equal(batch.kv_cache, want)
    # Everything outside the written slots is untouched.
    flat_before = before.view(2, -1, *before.shape[3:])
    flat_after = batch.kv_cache.view(2, -1, *before.shape[3:])
    written = torch.zeros(flat_before.shape[1], dtype=torch.bool, device=DEVICE)
    written[batch.attn.slot_mapping[batch.attn.slot_mapping >= 0]] = True
    assert torch.equal(flat_after[:, ~written], flat_before[:, ~written])
    assert not torch.equal(flat_after[:, written], flat_before[:, written])


def test_strided_qkv_views_match_oracle():
    batch = make_batch(9, [1, 7, 12], [20, 7, 40], num_pad_tokens=2, head_dim=32,
                       num_q_heads=4, num_kv_heads=2, fused_qkv=True)
    assert not batch.q.is_contiguous()
    run_and_check(batch, TritonAttentionBackend(), atol=1e-4)


def test_choose_num_splits():
    # Small decode batch, long context: split, bounded by max_splits.
    assert choose_num_splits(1, 8, 1, 32768, 132) == 32
    assert choose_num_splits(1, 8, 1, 32768, 132, max_splits=16) == 16
    # Moderate batch: split enough to reach about two programs per SM.
    assert choose_num_splits(8, 8, 1, 8192, 132) == 5
    # Short contexts, full grids, prefill chunks: no split.
    assert choose_num_splits(1, 8, 1, 300, 132) == 1
    assert choose_num_splits(32, 8, 1, 32768, 132) == 1
    assert choose_num_splits(1, 8, MAX_SPLIT_QUERY_LEN + 1, 32768, 132) == 1
    assert choose_num_splits(0, 8, 1, 32768, 132) == 1


@pytest.mark.parametrize("nqpk", [1, 3, 4, 8, 32])
@pytest.mark.parametrize("max_query_len", [1, 4, 512])
def test_tile_config_fits_a_kv_group(nqpk, max_query_len):
    config = tile_config(max_query_len, nqpk, 128)
    block_m = config["block_m"]
    assert block_m >= 16 and block_m & (block_m - 1) == 0
    assert block_m // nqpk >= 1
    if max_query_len == 1:
        assert block_m == max(16, 1 << (nqpk - 1).bit_length())
    split = tile_config(max_query_len, nqpk, 128, split=True)
    assert split["block_m"] == block_m
    if max_query_len == 1:  # a split decode batch: short key tiles on two warps
        assert (split["tile_n"], split["num_warps"]) == (64, 2)
        assert (config["tile_n"], config["num_warps"]) == (128, 4)


def test_rejects_mismatched_inputs():
    batch = make_batch(1, [2], [2], head_dim=32, num_q_heads=4, num_kv_heads=2)
    backend = TritonAttentionBackend()
    with pytest.raises(ValueError):
        backend.forward(batch.q[:, :3], batch.k, batch.v, batch.kv_cache, batch.attn, 1.0)
    with pytest.raises(ValueError):
        backend.forward(batch.q, batch.k.double(), batch.v, batch.kv_cache, batch.attn, 1.0)
    with pytest.raises(ValueError):
        TritonAttentionBackend(num_splits=0)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_half_precision_on_gpu(dtype, num_splits):
    query_lens = [1] * 6 + [37, 300, 1000]
    seq_lens = [1, 17, 500, 2049, 4000, 9000, 100, 812, 1000]
    for block_size in (16, 32):
        batch = make_batch(21, query_lens, seq_lens, num_pad_tokens=13, block_size=block_size,
                           head_dim=128, num_q_heads=32, num_kv_heads=8, dtype=dtype)
        run_and_check(batch, TritonAttentionBackend(num_splits=num_splits), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("num_splits", [None, 1])
def test_decode_cuda_graph_replay(num_splits):
    """Capture a decode step once, replay it with new lengths, tables and inputs."""
    backend = TritonAttentionBackend(num_splits=num_splits)
    shape = {"head_dim": 128, "num_q_heads": 32, "num_kv_heads": 8, "dtype": torch.bfloat16}
    first = make_batch(1, [1] * 4, [100, 3000, 17, 1], **shape)
    second = make_batch(2, [1] * 4, [2500, 5, 800, 4096], **shape)
    # One set of persistent buffers, big enough for both batches.
    num_blocks = max(first.kv_cache.shape[1], second.kv_cache.shape[1])
    width = max(first.attn.block_tables.shape[1], second.attn.block_tables.shape[1])
    cache = torch.zeros(2, num_blocks, 16, 8, 128, dtype=torch.bfloat16, device=DEVICE)
    tables = torch.zeros(4, width, dtype=torch.int32, device=DEVICE)
    static = {name: getattr(first, name).clone() for name in ("q", "k", "v")}
    seq_lens = first.attn.seq_lens.clone()
    slots = first.attn.slot_mapping.clone()
    attn = AttentionMetadata(4, 4, 4, 1, 4096, first.attn.query_start_loc, seq_lens, tables,
                             slots, first.attn.query_start_loc_cpu, first.attn.seq_lens_cpu)

    def load(batch: Batch) -> Batch:
        cache.zero_()
        cache[:, : batch.kv_cache.shape[1]] = batch.kv_cache
        tables.zero_()
        tables[:, : batch.attn.block_tables.shape[1]] = batch.attn.block_tables
        for name in ("q", "k", "v"):
            static[name].copy_(getattr(batch, name))
        seq_lens.copy_(batch.attn.seq_lens)
        slots.copy_(batch.attn.slot_mapping)
        return Batch(static["q"], static["k"], static["v"], cache, attn,
                     batch.query_lens, batch.seq_lens)

    load(first)
    backend.forward(static["q"], static["k"], static["v"], cache, attn, 0.1)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(static["q"], static["k"], static["v"], cache, attn, 0.1)
    for batch in (first, second):
        loaded = load(batch)
        want_cache = expected_cache(loaded)
        want = dense_reference(loaded, want_cache, 0.1)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(cache, want_cache)
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_merge_ignores_the_accumulators_of_empty_splits():
    # Empty splits leave their accumulator unwritten: NaN there must not leak.
    from runner.attention.triton_split_merge import merge_splits

    gen = torch.Generator().manual_seed(2)
    tokens, heads, splits, dim = 3, 2, 4, 16
    acc = torch.randn(tokens, heads, splits, dim, generator=gen)
    m = torch.randn(tokens, heads, splits, generator=gen)
    l_sum = torch.rand(tokens, heads, splits, generator=gen) + 0.5
    m[:, :, 2:] = float("-inf")  # splits 2 and 3 empty everywhere
    m[2] = float("-inf")  # token 2 saw no key at all
    l_sum[m == float("-inf")] = 0.0
    acc[m == float("-inf")] = float("nan")
    w = torch.exp2(m - m.amax(-1, keepdim=True).clamp(min=-1e30).nan_to_num(0.0))
    w = torch.where(m == float("-inf"), 0.0, w)
    total = (w * l_sum).sum(-1, keepdim=True)
    want = (torch.where(w[..., None] > 0, acc, 0.0) * w[..., None]).sum(-2)
    want = want / torch.where(total > 0, total, 1.0)
    out = torch.full((tokens, heads, dim), 7.0)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    got = dev(out)
    merge_splits(got, dev(acc), dev(m), dev(l_sum))
    got = got.cpu()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got[2] == 0).all()
