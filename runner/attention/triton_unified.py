"""Unified paged-attention Triton kernel: decodes and prefill chunks in one launch.

Work split. The grid is (num_q_blocks, num_kv_heads[, num_splits]). A q-block is up
to BLOCK_Q consecutive query tokens of one batch row; its program processes those
tokens for all NQPK query heads that share one KV head (GQA packing), so its tile
has BLOCK_M = BLOCK_Q * NQPK rows (padded) and a one-token decode still fills a
tensor-core tile with its heads. Row r of the batch owns the q-blocks
  start(r) .. start(r + 1) - 1,   start(r) = query_start_loc[r] // BLOCK_Q + r,
which is strictly increasing and gives every row at least ceil(q_len / BLOCK_Q)
blocks. A pseudo-row num_reqs covers the padding tokens
query_start_loc[num_reqs] .. num_tokens - 1 with no keys, so they come out as
zeros. Hence num_q_blocks = num_tokens // BLOCK_Q + num_reqs + 1 suffices, a
number fixed by host ints; programs past their row's last token exit at once.

Uniform decode batches (every row exactly one query token, DECODE) skip the
search: program r of the first grid axis takes token r, row r's, and loads
each key tile's values together with its keys; a decode program's chain of
dependent loads is then the length, the block table, then keys and values.

Causality. Query token j of a row with q_len tokens and seq_len keys sits at
position seq_len - q_len + j and sees keys at positions <= its own. Keys are read
TILE_N at a time through the row's block table (key p lives in block
block_table[r, p // BLOCK_SIZE] at offset p % BLOCK_SIZE), so the tile size is
independent of the page size. The loop runs to the row's seq_len read on the
device: nothing depends on sequence lengths on the host. With a sliding
window W (SLIDING) a query at position q sees only keys k > q - W: the loop
starts at the tile of the q-block's first visible key, and every tile is
masked.

Softmax. Online softmax in float32 with base-2 exponentials (the scale is folded
with log2(e)). Rows that see no key keep m = -inf, l = 0 and produce 0, not NaN.

Split-KV (flash decoding). With SPLIT (a third grid axis of S splits), split
s handles an equal share of the q-block's key tiles, so the splits holding
tiles are the leading ones. Each stores its unnormalised accumulator, running
max m and sum l, then takes a ticket from its (q-program, KV head) counter;
the last to arrive merges every split's partials into out in the same launch
and resets the counter (runner/ticket_counters.py: the protocol and its
memory order; triton_split_merge.py: the math). Empty splits (short context, graph captured for long
ones) read no key and store nothing, but still take their ticket.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from runner.attention.triton_split_merge import SplitPartials, merge_config, merge_split_rows
from runner.ops import pdl_launch
from runner.ticket_counters import take_ticket
from runner.triton_dependent_launch import wait_for_previous_kernel

LOG2_E = 1.4426950408889634
# Cache offsets in int32 where every element of one layer's key (or value)
# cache lies within 2**31 - 1 elements of its start (``int32_offsets``):
# a key tile's addresses then take fewer registers than with int64 offsets.
KV_OFFSETS_32 = True
# Pipeline depth of the loop over TMA boxes (``short_keys`` of
# ``launch_paged_attention``): its tiles are small, so many are in flight.
SHORT_DECODE_STAGES = 6


@triton.jit
def _find_row(query_start_loc_ptr, q_block, num_reqs, BLOCK_Q: tl.constexpr):
    """Largest r in [0, num_reqs] with query_start_loc[r] // BLOCK_Q + r <= q_block."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_reqs + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        start = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        lo = tl.where(start <= q_block, mid, lo)
        hi = tl.where(start <= q_block, hi, mid)
    return lo


@triton.jit
def _locate_q_block(query_start_loc_ptr, q_block, num_reqs, num_tokens, BLOCK_Q: tl.constexpr):
    """(row, first token, query length, index of the q-block within its row).

    Row num_reqs is the padding tail: tokens query_start_loc[num_reqs] .. num_tokens-1.
    """
    row = _find_row(query_start_loc_ptr, q_block, num_reqs, BLOCK_Q)
    q_first = tl.load(query_start_loc_ptr + row)
    q_stop = tl.load(query_start_loc_ptr + row + 1, mask=row < num_reqs, other=num_tokens)
    local = q_block - (q_first // BLOCK_Q + row)
    return row, q_first, q_stop - q_first, local


@triton.jit
def _load_tile(ptrs, key_mask, dim_mask, MASK_KEYS: tl.constexpr, MASK_DIMS: tl.constexpr):
    """Load ptrs with zeros where key_mask (if MASK_KEYS) or dim_mask (if MASK_DIMS) fail."""
    if MASK_KEYS and MASK_DIMS:
        tile = tl.load(ptrs, mask=key_mask & dim_mask, other=0.0)
    elif MASK_KEYS:
        tile = tl.load(ptrs, mask=key_mask, other=0.0)
    elif MASK_DIMS:
        tile = tl.load(ptrs, mask=dim_mask, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _attend_tiles(
    q,
    acc,
    m_i,
    l_i,
    q_pos,
    tile_lo,
    tile_hi,
    kv_end,
    key_cache_ptr,
    value_cache_ptr,
    block_table_row_ptr,
    kv_head_offset,
    stride_c_block,
    stride_c_slot,
    qk_scale,
    window,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DIM_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
    SLIDING: tl.constexpr,
    EARLY_V: tl.constexpr,
    OFFSETS_32: tl.constexpr,
    TMA: tl.constexpr,
    LOOP_STAGES: tl.constexpr = None,
):
    """Fold key tiles tile_lo .. tile_hi - 1 (keys < kv_end) into (acc, m_i, l_i).

    With MASKED false the caller guarantees that every key of these tiles is below
    kv_end and visible to every row, so no causal or bounds mask is applied.
    With TMA the caches are tensor descriptors over [blocks * BLOCK_SIZE,
    heads * HEAD_DIM] and a tile is one cache block (TILE_N == BLOCK_SIZE):
    one box of keys and one of values at row block * BLOCK_SIZE, column
    kv_head_offset. A box cannot mask keys, so a masked tile's values past
    kv_end (never written, possibly NaN) are zeroed before they meet p.
    LOOP_STAGES: the loop's pipeline depth (None: the launch's num_stages).
    """
    dims = tl.arange(0, DIM_PAD)
    dim_mask = dims < HEAD_DIM
    MASK_DIMS: tl.constexpr = DIM_PAD != HEAD_DIM
    for tile in tl.range(tile_lo, tile_hi, num_stages=LOOP_STAGES):
        key_pos = tile * TILE_N + tl.arange(0, TILE_N)
        key_mask = key_pos < kv_end
        if TMA:  # the tile is cache block number `tile` of the row
            row = tl.load(block_table_row_ptr + tile) * BLOCK_SIZE
            k_t = tl.trans(key_cache_ptr.load([row, kv_head_offset]))
            v = value_cache_ptr.load([row, kv_head_offset])
            if MASKED:
                v = tl.where(key_mask[:, None], v, 0.0)
        else:
            block = _load_tile(block_table_row_ptr + key_pos // BLOCK_SIZE, key_mask, key_mask,
                               MASKED, False)
            if not OFFSETS_32:
                block = block.to(tl.int64)
            key_off = block * stride_c_block + (key_pos % BLOCK_SIZE) * stride_c_slot
            key_off = key_off + kv_head_offset
            k_t = _load_tile(key_cache_ptr + key_off[None, :] + dims[:, None], key_mask[None, :],
                             dim_mask[:, None], MASKED, MASK_DIMS)
            if EARLY_V:  # in flight with k_t rather than after the softmax
                v = _load_tile(value_cache_ptr + key_off[:, None] + dims[None, :],
                               key_mask[:, None], dim_mask[None, :], MASKED, MASK_DIMS)
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            visible = (key_pos[None, :] <= q_pos[:, None]) & key_mask[None, :]
            if SLIDING:
                visible = visible & (key_pos[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if MASKED:
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_safe = m_new
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)

        if not EARLY_V and not TMA:
            v = _load_tile(value_cache_ptr + key_off[:, None] + dims[None, :], key_mask[:, None],
                           dim_mask[None, :], MASKED, MASK_DIMS)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attend_share(q, q_pos, kv_end, context_len, local, window, key_cache, value_cache,
                  table_row, kv_head_offset, stride_c_block, stride_c_slot, qk_scale,
                  num_splits, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                  TILE_N: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_Q: tl.constexpr, DOT_PRECISION: tl.constexpr, SLIDING: tl.constexpr,
                  DECODE: tl.constexpr, OFFSETS_32: tl.constexpr, SPLIT: tl.constexpr,
                  TMA: tl.constexpr, LOOP_STAGES: tl.constexpr):
    """This program's share of its q-block's keys, read TILE_N at a time:
    (acc, m, l, whether the share held a tile, how many splits hold tiles)."""
    num_tiles = tl.cdiv(kv_end, TILE_N)
    first_tile = 0
    if SLIDING:
        # The first key any token of the q-block sees.
        first_key = tl.maximum(context_len + local * BLOCK_Q - window + 1, 0)
        first_tile = tl.minimum(first_key // TILE_N, num_tiles)
    # Leading tiles whose keys all precede the q-block's first token need no
    # mask (without a window: with one, every tile is masked).
    num_full = tl.minimum(tl.maximum((context_len + local * BLOCK_Q + 1) // TILE_N, 0), num_tiles)
    if SLIDING:
        num_full = first_tile
    tile_lo = first_tile
    tile_hi = num_tiles
    per_split = num_tiles - first_tile
    if SPLIT:
        per_split = tl.cdiv(num_tiles - first_tile, num_splits)
        tile_lo = tl.minimum(first_tile + tl.program_id(2) * per_split, num_tiles)
        tile_hi = tl.minimum(tile_lo + per_split, num_tiles)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _attend_tiles(
        q, acc, m_i, l_i, q_pos, tile_lo, tl.minimum(tile_hi, num_full), kv_end,
        key_cache, value_cache, table_row, kv_head_offset, stride_c_block,
        stride_c_slot, qk_scale, window, HEAD_DIM, BLOCK_SIZE, TILE_N, DIM_PAD, DOT_PRECISION,
        False, SLIDING, DECODE, OFFSETS_32, TMA, LOOP_STAGES,
    )
    acc, m_i, l_i = _attend_tiles(
        q, acc, m_i, l_i, q_pos, tl.maximum(tile_lo, num_full), tile_hi, kv_end,
        key_cache, value_cache, table_row, kv_head_offset, stride_c_block,
        stride_c_slot, qk_scale, window, HEAD_DIM, BLOCK_SIZE, TILE_N, DIM_PAD, DOT_PRECISION,
        True, SLIDING, DECODE, OFFSETS_32, TMA, LOOP_STAGES,
    )
    num_live = tl.cdiv(num_tiles - first_tile, tl.maximum(per_split, 1))
    return acc, m_i, l_i, tile_lo < tile_hi, num_live


@triton.jit
def _tile_rows(local, kv_head, q_len, ROWS: tl.constexpr, NQPK: tl.constexpr,
               BLOCK_Q: tl.constexpr):
    """(token index within the batch row, query head, mask) of ROWS tile rows
    of q-block ``local``: tile row i is token i // NQPK's head i % NQPK."""
    offs = tl.arange(0, ROWS)
    tok = local * BLOCK_Q + offs // NQPK
    head = kv_head * NQPK + offs % NQPK
    return tok, head, (offs // NQPK < BLOCK_Q) & (tok < q_len)


@triton.jit(do_not_specialize=["num_reqs", "num_tokens"])
def _paged_attention_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    counters_ptr,
    q_ptr,
    key_cache_ptr,
    value_cache_ptr,
    key_boxes,
    value_boxes,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    qk_scale,
    num_reqs,
    num_tokens,
    num_q_heads,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_bt,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    num_splits,
    window,
    HEAD_DIM: tl.constexpr,
    NQPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SPLIT: tl.constexpr,
    MERGE_ROWS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SLIDING: tl.constexpr,
    DECODE: tl.constexpr,
    OFFSETS_32: tl.constexpr,
    SHORT_KEYS: tl.constexpr,
    SHORT_STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    kv_head = tl.program_id(1)
    if DECODE:
        # Token r is row r's only query token: nothing to look up.
        row = tl.program_id(0)
        q_first = row
        q_len = tl.full([], 1, tl.int32)
        local = 0
    else:
        # Reverse order: the last q-blocks of long prompts see the most keys; start them first.
        q_block = tl.num_programs(0) - 1 - tl.program_id(0)
        row, q_first, q_len, local = _locate_q_block(
            query_start_loc_ptr, q_block, num_reqs, num_tokens, BLOCK_Q
        )
        if local * BLOCK_Q >= q_len:
            return
    context_len = tl.load(seq_lens_ptr + row, mask=row < num_reqs, other=0) - q_len

    tok, head, row_mask = _tile_rows(local, kv_head, q_len, BLOCK_M, NQPK, BLOCK_Q)
    q_pos = context_len + tok
    dims = tl.arange(0, DIM_PAD)
    io_mask = row_mask[:, None] & (dims < HEAD_DIM)[None, :]
    tok64 = (q_first + tok).to(tl.int64)
    q_rows = tok64 * stride_q_tok + head * stride_q_head

    # Keys this q-block may see: up to its last token's position, inclusive.
    last_tok = tl.minimum((local + 1) * BLOCK_Q, q_len)
    kv_end = tl.maximum(context_len + last_tok, 0)
    table_row = block_tables_ptr + row.to(tl.int64) * stride_bt
    kv_head_offset = kv_head * stride_c_head
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :], mask=io_mask, other=0.0)
    # The pointer-tile call stands twice: without SHORT_KEYS there are no
    # descriptors, so the box call must lie under the compile-time test
    # alone (a runtime flag set under it makes Triton compile both calls).
    if SHORT_KEYS > 0:
        # A row of at most SHORT_KEYS keys: one cache block a tile through
        # TMA boxes, SHORT_STAGES deep (every split of the row takes this path).
        if kv_end <= SHORT_KEYS:
            acc, m_i, l_i, holds, num_live = _attend_share(
                q, q_pos, kv_end, context_len, local, window, key_boxes, value_boxes,
                table_row, kv_head_offset, stride_c_block, stride_c_slot, qk_scale,
                num_splits, HEAD_DIM, BLOCK_SIZE, BLOCK_SIZE, DIM_PAD, BLOCK_M, BLOCK_Q,
                DOT_PRECISION, SLIDING, DECODE, OFFSETS_32, SPLIT, True, SHORT_STAGES)
        else:
            acc, m_i, l_i, holds, num_live = _attend_share(
                q, q_pos, kv_end, context_len, local, window, key_cache_ptr, value_cache_ptr,
                table_row, kv_head_offset, stride_c_block, stride_c_slot, qk_scale,
                num_splits, HEAD_DIM, BLOCK_SIZE, TILE_N, DIM_PAD, BLOCK_M, BLOCK_Q,
                DOT_PRECISION, SLIDING, DECODE, OFFSETS_32, SPLIT, False, None)
    else:
        acc, m_i, l_i, holds, num_live = _attend_share(
            q, q_pos, kv_end, context_len, local, window, key_cache_ptr, value_cache_ptr,
            table_row, kv_head_offset, stride_c_block, stride_c_slot, qk_scale,
            num_splits, HEAD_DIM, BLOCK_SIZE, TILE_N, DIM_PAD, BLOCK_M, BLOCK_Q,
            DOT_PRECISION, SLIDING, DECODE, OFFSETS_32, SPLIT, False, None)

    if SPLIT:
        if holds:  # else an empty split: nothing to store, it only counts
            part = (tok64 * num_q_heads + head) * num_splits + tl.program_id(2)
            tl.store(part_max_ptr + part, m_i, mask=row_mask)
            tl.store(part_sum_ptr + part, l_i, mask=row_mask)
            tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc, mask=io_mask)
        counter = counters_ptr + tl.program_id(0) * tl.num_programs(1) + kv_head
        if take_ticket(counter, num_splits):
            # The splits holding tiles are the leading ones; the merging
            # program covers MERGE_ROWS rows (a decode's NQPK heads, not all
            # BLOCK_M).
            m_tok, m_head, m_mask = _tile_rows(local, kv_head, q_len, MERGE_ROWS, NQPK, BLOCK_Q)
            m_tok64 = (q_first + m_tok).to(tl.int64)
            merge_split_rows(
                out_ptr, m_tok64 * stride_o_tok + m_head * stride_o_head, part_acc_ptr,
                part_max_ptr, part_sum_ptr, (m_tok64 * num_q_heads + m_head) * num_splits,
                m_mask, num_live, MERGE_ROWS, HEAD_DIM, DIM_PAD, SPLITS_PAD, SPLIT_CHUNK,
            )
    else:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        o_off = tok64[:, None] * stride_o_tok + head[:, None] * stride_o_head + dims[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=io_mask)


def num_q_blocks(num_tokens: int, num_reqs: int, block_q: int) -> int:
    """Grid size along q-blocks: enough for every row plus the padding tail."""
    return num_tokens // block_q + num_reqs + 1


def q_programs(num_tokens: int, num_reqs: int, block_q: int, uniform_decode: bool) -> int:
    """The grid's first axis: one program per token of a uniform decode batch,
    else one per q-block."""
    return num_tokens if uniform_decode else num_q_blocks(num_tokens, num_reqs, block_q)


def split_counters_needed(num_tokens: int, num_reqs: int, num_q_heads: int, num_kv_heads: int,
                          block_m: int, uniform_decode: bool) -> int:
    """Counters a split launch of this shape takes tickets from: one per
    (q-program, KV head), whatever the number of splits."""
    block_q = block_m // (num_q_heads // num_kv_heads)
    return q_programs(num_tokens, num_reqs, block_q, uniform_decode) * num_kv_heads


def int32_offsets(cache: torch.Tensor) -> bool:
    """Whether the kernel may compute offsets into ``cache`` (a layer's key
    or value half, values at the same offsets) in int32: its farthest
    element lies below 2**31 elements from its start, and ``KV_OFFSETS_32``."""
    farthest = sum((size - 1) * stride for size, stride in zip(cache.shape, cache.stride()))
    return KV_OFFSETS_32 and cache.numel() > 0 and farthest < 2**31


def block_boxes(kv_cache: torch.Tensor, short_keys: int, uniform_decode: bool
                ) -> tuple[TensorDescriptor, TensorDescriptor] | None:
    """Tensor descriptors over the key and value halves of ``kv_cache`` (2,
    blocks, BLOCK_SIZE, heads, dim), each viewed as [blocks * BLOCK_SIZE,
    heads * dim] with one block's keys (or values) of one head as its box,
    or None where every row gathers with pointers instead: unless
    ``short_keys`` and a uniform decode batch, and where the cache is
    not contiguous, 16-byte aligned, with power-of-two block size (>= 8) and
    head dim (>= 16)."""
    if not (short_keys and uniform_decode) or not kv_cache.is_contiguous():
        return None
    _, blocks, block_size, heads, dim = kv_cache.shape
    powers = all(n >= least and n & (n - 1) == 0 for n, least in ((block_size, 8), (dim, 16)))
    if not powers or kv_cache.data_ptr() % 16:
        return None
    shape, strides, box = [blocks * block_size, heads * dim], [heads * dim, 1], [block_size, dim]
    return tuple(TensorDescriptor(half, shape, strides, box) for half in kv_cache)


def launch_paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_reqs: int,
    scale: float,
    out: torch.Tensor,
    partials: SplitPartials | None,
    *,
    sliding_window: int | None = None,
    uniform_decode: bool = False,
    block_m: int,
    tile_n: int,
    num_warps: int,
    num_stages: int,
    short_keys: int = 0,
) -> None:
    """Run the kernel over all q.shape[0] tokens; the normalised result goes to
    out [T, Hq, D].

    With partials (``SplitPartials``: acc [T, Hq, S, D], max and sum [T, Hq, S]
    float32, and zeroed counters) it runs S = acc.shape[2] splits per q-block;
    the last of them to finish merges all into out and leaves its counter at
    0 again (triton_split_merge.py).
    ``sliding_window`` W limits each query at position q to keys k > q - W.
    ``uniform_decode``: every row has exactly one query token (token r is
    row r's, tokens past num_reqs are padding), so each program takes one
    token without searching ``query_start_loc``, and loads its values with
    its keys. ``short_keys`` (uniform decode only): rows of at most that
    many keys read one cache block a key tile through TMA boxes
    (``block_boxes``), SHORT_DECODE_STAGES deep, the longer ones ``tile_n``
    keys a tile through pointers: short rows gain from many small tiles in
    flight, long ones from few large ones, and a graph's launch serves both.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    num_kv_heads = key_cache.shape[2]
    nqpk = num_q_heads // num_kv_heads
    block_q = block_m // nqpk
    num_splits = 1 if partials is None else partials.acc.shape[2]
    grid = (q_programs(num_tokens, num_reqs, block_q, uniform_decode), num_kv_heads, num_splits)
    merge_rows = triton.next_power_of_2(nqpk) if uniform_decode else block_m
    boxes = block_boxes(kv_cache, short_keys, uniform_decode)
    if partials is None:
        partials = SplitPartials(out, out, out, out)
    elif partials.counters.numel() < grid[0] * grid[1]:
        raise ValueError(f"{partials.counters.numel()} split counters for a grid of "
                         f"{grid[0]} x {grid[1]} programs")
    _paged_attention_kernel[grid](
        out, *partials,
        q, key_cache, value_cache, *(boxes or (None, None)), block_tables, seq_lens,
        query_start_loc,
        scale * LOG2_E, num_reqs, num_tokens, num_q_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), num_splits,
        sliding_window or 0,
        HEAD_DIM=head_dim,
        NQPK=nqpk,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_SIZE=key_cache.shape[1],
        TILE_N=tile_n,
        DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        SPLIT=num_splits > 1,
        MERGE_ROWS=merge_rows,
        **merge_config(num_splits, merge_rows),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        SLIDING=sliding_window is not None,
        DECODE=uniform_decode,
        OFFSETS_32=int32_offsets(key_cache),
        SHORT_KEYS=short_keys if boxes else 0,
        SHORT_STAGES=SHORT_DECODE_STAGES,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_launch(q.device),
    )
