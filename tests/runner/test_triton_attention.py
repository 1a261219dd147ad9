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

from runner.attention import triton_unified
from runner.attention.metadata import AttentionMetadata
from runner.attention.triton_attn import (
    MAX_SPLIT_QUERY_LEN,
    MAX_SPLITS,
    TritonAttentionBackend,
    choose_num_splits,
    tile_config,
    wide_decode_grid,
)
from runner.attention.triton_kv_write import write_kv_cache
from runner.attention.triton_split_merge import SplitPartials
from runner.attention.triton_unified import block_boxes, int32_offsets, launch_paged_attention
from runner.attention.tuned_decode import TUNED_DECODE, TUNED_NUM_SMS, tuned_decode_launch
from runner.ticket_counters import TicketCounters
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


@pytest.mark.parametrize("query_lens,seq_lens", [([1, 1, 1, 1], [1, 33, 130, 257]),
                                                 (MIXED_QUERY_LENS, MIXED_SEQ_LENS)])
def test_int64_cache_offsets_match_oracle(monkeypatch, query_lens, seq_lens):
    """The kernel's int64 offsets (caches too large for int32 ones: every
    test cache is small, so they are forced here) give the oracle's result."""
    monkeypatch.setattr(triton_unified, "KV_OFFSETS_32", False)
    batch = make_batch(29, query_lens, seq_lens, num_pad_tokens=2, block_size=16,
                       head_dim=64, num_q_heads=8, num_kv_heads=2)
    assert not int32_offsets(batch.kv_cache[0])
    out = run_and_check(batch, TritonAttentionBackend(num_splits=3), atol=1e-4)
    assert (out[batch.attn.num_tokens :] == 0).all()


def test_int32_offsets_only_where_the_cache_allows():
    def cache(num_blocks):  # a layer's key half: 16 slots x 8 heads x 128 dims a block
        return torch.empty((2, num_blocks, 16, 8, 128), device="meta")[0]
    assert int32_offsets(cache(2**17))  # its last element is 2**31 - 1 on
    assert not int32_offsets(cache(2**17 + 1))
    assert int32_offsets(torch.empty(3, 16, 2, 64)[1:])  # a strided view, small


def poison_past_seq_lens(batch: Batch) -> None:
    """NaN into the unwritten slots of each row's last block (as an
    uninitialised cache may hold): a kernel that reads them unmasked fails."""
    block_size = batch.kv_cache.shape[2]
    for row, seq_len in enumerate(batch.seq_lens):
        for pos in range(seq_len, -(-seq_len // block_size) * block_size):
            block = int(batch.attn.block_tables[row, pos // block_size])
            batch.kv_cache[:, block, pos % block_size] = float("nan")


@pytest.mark.parametrize("short_keys", [130, 10**6])
@pytest.mark.parametrize("num_splits,window", [(1, None), (3, None), (2, 40)])
def test_short_decode_rows_through_tma_boxes_match_oracle(short_keys, num_splits, window):
    """Uniform decode rows of at most ``short_keys`` keys read through TMA
    boxes (one cache block a key tile), the longer ones through pointer
    tiles, in one launch (130: the rows of 1-130 keys one way, 257 the
    other; 10**6: every row through boxes): the oracle's result, and values
    past a row's length, NaN here, never reach it."""
    batch = make_batch(31, [1, 1, 1, 1, 1], [1, 16, 33, 130, 257], num_pad_tokens=3,
                       block_size=16, head_dim=64, num_q_heads=8, num_kv_heads=2)
    assert batch.attn.uniform_decode and block_boxes(batch.kv_cache, short_keys, True)
    poison_past_seq_lens(batch)
    want = dense_reference(batch, expected_cache(batch), batch.q.shape[-1] ** -0.5, window)
    backend = TritonAttentionBackend(num_splits=num_splits, short_decode_keys=short_keys)
    out = backend.forward(
        batch.q, batch.k, batch.v, batch.kv_cache, batch.attn, batch.q.shape[-1] ** -0.5,
        sliding_window=window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), want, atol=1e-4, rtol=0)
    assert (out[batch.attn.num_tokens :] == 0).all()


def test_block_boxes_only_where_they_apply():
    cache = torch.zeros(2, 6, 16, 2, 64)
    assert block_boxes(cache, 0, uniform_decode=True) is None
    boxes = block_boxes(cache, 512, uniform_decode=True)
    assert [(b.shape, b.strides, b.block_shape) for b in boxes] == [
        ([96, 128], [128, 1], [16, 64])] * 2
    assert boxes[1].base.data_ptr() == cache[1].data_ptr()
    assert block_boxes(cache, 512, uniform_decode=False) is None
    assert block_boxes(torch.zeros(2, 6, 4, 2, 64), 512, True) is None  # blocks of 4 keys
    assert block_boxes(torch.zeros(2, 6, 16, 2, 48), 512, True) is None  # head dim 48
    assert block_boxes(torch.zeros(2, 16, 6, 2, 64).transpose(1, 2), 512, True) is None


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


def test_wide_decode_grid():
    """Wide tiles from two programs an SM for 128-wide heads, from three for
    narrower ones (132 SMs, 8 KV heads: 33 and 50 rows)."""
    assert not wide_decode_grid(32, 8, 128, 132)
    assert wide_decode_grid(33, 8, 128, 132)
    assert wide_decode_grid(33, 4, 256, 66)
    assert not wide_decode_grid(49, 8, 64, 132)
    assert wide_decode_grid(50, 8, 64, 132)


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
        wide = tile_config(max_query_len, nqpk, 128, wide=True)
        assert (wide["tile_n"], wide["num_warps"], wide["num_stages"]) == (64, 2, 3)


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


def _split_launch(batch: Batch, cache: torch.Tensor, num_splits: int, counters: torch.Tensor,
                  window: int | None = None) -> torch.Tensor:
    """One split launch over ``cache`` with out and every partial starting as
    NaN: a value the kernel should not read, or a row it should write and
    does not, shows up as NaN."""
    q, attn = batch.q, batch.attn
    num_tokens, num_q_heads, head_dim = q.shape
    nan = {"fill_value": float("nan"), "dtype": torch.float32, "device": DEVICE}
    shape = (num_tokens, num_q_heads, num_splits)
    partials = SplitPartials(torch.full((*shape, head_dim), **nan), torch.full(shape, **nan),
                             torch.full(shape, **nan), counters)
    out = torch.full_like(q, float("nan"))
    config = tile_config(attn.max_query_len, num_q_heads // cache.shape[3], head_dim)
    launch_paged_attention(q, cache, attn.block_tables, attn.seq_lens, attn.query_start_loc,
                           attn.num_reqs, head_dim ** -0.5, out, partials,
                           sliding_window=window, uniform_decode=attn.uniform_decode, **config)
    return out


@pytest.mark.parametrize("query_lens,seq_lens,head_dim", [
    ([1, 1, 1], [40, 300, 129], 32),  # uniform decode
    ([1, 3, 1, 0], [70, 40, 260, 0], 48),  # q-blocks of several tokens; head dim padded
])
def test_split_launch_twice_resets_its_counters(query_lens, seq_lens, head_dim):
    """The last split of each group puts its counter back to 0, so the same
    launch run again (a graph replay) merges again: both runs match the
    oracle and the counters are all zero after each."""
    batch = make_batch(31, query_lens, seq_lens, num_pad_tokens=2, block_size=16,
                       head_dim=head_dim, num_q_heads=4, num_kv_heads=2)
    cache = expected_cache(batch)
    want = dense_reference(batch, cache, batch.q.shape[-1] ** -0.5)
    counters = torch.zeros(256, dtype=torch.int32, device=DEVICE)
    for _ in range(2):
        out = _split_launch(batch, cache, 3, counters)
        torch.testing.assert_close(out.float(), want, atol=1e-4, rtol=0)
        assert (counters == 0).all()


@pytest.mark.parametrize("window", [None, 50])
def test_empty_splits_count_and_are_never_read(window):
    """Eight splits over contexts of 1 to 3 key tiles (a graph captured for
    long contexts replayed on short ones): most splits own no tile, write no
    partial and take only their ticket; the merge reads none of their NaNs
    and every row, padding ones included, is written."""
    batch = make_batch(37, [1, 1, 1, 1, 1], [1, 3, 128, 129, 300], num_pad_tokens=3,
                       block_size=16, head_dim=32, num_q_heads=8, num_kv_heads=2)
    assert batch.attn.uniform_decode
    cache = expected_cache(batch)
    want = dense_reference(batch, cache, batch.q.shape[-1] ** -0.5, window)
    counters = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    out = _split_launch(batch, cache, 8, counters, window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), want, atol=1e-4, rtol=0)
    assert (out[batch.attn.num_tokens:] == 0).all()
    assert (counters == 0).all()


def test_split_launch_rejects_too_few_counters():
    batch = make_batch(3, [1, 1], [20, 40], head_dim=32, num_q_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match="split counters"):
        _split_launch(batch, expected_cache(batch), 2, torch.zeros(3, dtype=torch.int32))


def test_backend_runs_split_launches_back_to_back():
    """One backend (one set of counters) through several split forwards of
    different shapes in a row, as the layers of a step and the next step do."""
    backend = TritonAttentionBackend(num_splits=4)
    for seed, seq_lens in enumerate([[5, 200], [130, 1, 64], [5, 200]]):
        batch = make_batch(seed, [1] * len(seq_lens), seq_lens, head_dim=32, num_q_heads=4,
                           num_kv_heads=2)
        run_and_check(batch, backend, atol=1e-4)


def test_split_counters_grow_and_keep_what_they_outgrew():
    counters = TicketCounters()
    first = counters.at_least(10, torch.device("cpu"))
    assert first.dtype == torch.int32 and (first == 0).all() and first.numel() >= 10
    assert counters.at_least(first.numel(), torch.device("cpu")) is first
    grown = counters.at_least(first.numel() + 1, torch.device("cpu"))
    assert grown.numel() > first.numel() and (grown == 0).all()
    assert any(old is first for old in counters._outgrown)  # a captured graph may point at it


def test_tuned_decode_launch_lookup():
    """An entry serves the batches above the next smaller listed size up to
    its own; None entries, other devices, other shapes and larger batches
    keep the rules."""
    assert tuned_decode_launch(64, 4, 8, 3, 132) == TUNED_DECODE[(64, 4, 8, 4)]
    assert tuned_decode_launch(128, 4, 8, 5, 132) == TUNED_DECODE[(128, 4, 8, 8)]
    assert tuned_decode_launch(128, 4, 8, 32, 132) == TUNED_DECODE[(128, 4, 8, 32)]
    for rules in ((128, 4, 8, 1, 132), (128, 4, 8, 4, 132), (128, 4, 8, 33, 132),
                  (128, 4, 8, 65, 132), (128, 4, 8, 8, 108), (128, 4, 4, 8, 132),
                  (64, 4, 8, 65, 132)):
        assert tuned_decode_launch(*rules) is None
    for launch in TUNED_DECODE.values():
        assert launch is None or (1 <= launch.num_splits <= MAX_SPLITS
                                  and launch.tile_n in (32, 64, 128))


@pytest.mark.parametrize("head_dim,seq_lens,entry", [(64, [40, 130], 2), (128, [1, 90, 200, 17, 64], 8)])
def test_tuned_decode_batch_matches_oracle(monkeypatch, head_dim, seq_lens, entry):
    """A half-precision uniform decode batch of a tuned shape (8 KV heads,
    4 query heads each) launches with its table entry and matches the
    oracle (float16: the interpreter on CPU computes bfloat16 wrongly)."""
    import runner.attention.triton_attn as triton_attn

    launches = []

    def spy(*args, **kwargs):
        partials = args[-1]
        launches.append((1 if partials is None else partials.acc.shape[2], kwargs["tile_n"],
                         kwargs["num_warps"], kwargs["num_stages"],
                         kwargs.get("short_keys", 0)))
        return launch_paged_attention(*args, **kwargs)

    monkeypatch.setattr(triton_attn, "launch_paged_attention", spy)
    monkeypatch.setattr(triton_attn, "num_sms", lambda device: TUNED_NUM_SMS)
    batch = make_batch(31, [1] * len(seq_lens), seq_lens, block_size=16, head_dim=head_dim,
                       num_q_heads=32, num_kv_heads=8, dtype=torch.float16)
    out = run_and_check(batch, TritonAttentionBackend(), atol=2e-2, rtol=2e-2)
    assert launches == [tuple(TUNED_DECODE[(head_dim, 4, 8, entry)])]
    assert torch.isfinite(out).all()


def test_uniform_decode_splits_as_its_graph_does(monkeypatch):
    """An eager uniform decode batch splits as a capture would (long contexts
    assumed), so replayed and eager decode steps sum in the same order; a
    mixed batch with the same short rows takes the split its lengths give."""
    import runner.attention.triton_attn as triton_attn

    splits = []

    def spy(*args, **kwargs):
        partials = args[-1]
        splits.append(1 if partials is None else partials.acc.shape[2])
        return launch_paged_attention(*args, **kwargs)

    monkeypatch.setattr(triton_attn, "launch_paged_attention", spy)
    decode = make_batch(41, [1, 1], [40, 90], head_dim=32, num_q_heads=4, num_kv_heads=2)
    assert decode.attn.uniform_decode
    run_and_check(decode, TritonAttentionBackend(), atol=1e-4)
    mixed = make_batch(42, [1, 3], [40, 90], head_dim=32, num_q_heads=4, num_kv_heads=2)
    run_and_check(mixed, TritonAttentionBackend(), atol=1e-4)
    sms = triton_attn.num_sms(decode.q.device)
    assert splits == [choose_num_splits(2, 2, 1, 1 << 30, sms), 1]
    assert splits[0] > 1
