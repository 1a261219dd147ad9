"""Triton paged-attention backend: the default on GPU.

One forward = one KV-write launch (triton_kv_write.py) + one unified attention
launch over the whole mixed batch (triton_unified.py); for small decode
batches with long contexts that launch splits each q-block's keys and its
last split merges the partials (triton_split_merge.py), still one launch.

Host synchronisation: none. Grids and tile choices come from host ints only
(tensor shapes and AttentionMetadata's num_reqs / max_query_len / max_seq_len);
sequence lengths, block tables and query offsets are read on the device. For a
pure-decode batch of a given padded size every grid is fixed, so forward() can be
captured in a CUDA graph and replayed with other seq_lens and block tables. The
split choice is the one heuristic input that depends on max_seq_len; a
uniform decode batch (what the decode graphs capture) and any capture assume
long contexts (short ones stay correct, their surplus splits are simply
empty), so a decode step sums in the same order whether it replays a graph
or runs eagerly: its tokens do not depend on which. The splits' counters persist
(``TicketCounters``): every launch leaves them zero, so a replay needs no
memset.
"""

from __future__ import annotations

import torch
import triton

from runner.attention.fresh_prefill import attend_fresh_rows, fresh_suffix_start
from runner.attention.metadata import AttentionMetadata, leading_rows
from runner.attention.triton_kv_write import write_kv_cache
from runner.attention.triton_split_merge import SplitPartials
from runner.attention.triton_unified import launch_paged_attention, split_counters_needed
from runner.attention.tuned_decode import DecodeLaunch, tuned_decode_launch
from runner.ops import device_ops, is_capturing, num_sms
from runner.ticket_counters import TicketCounters

MAX_SPLITS = 32
MIN_KEYS_PER_SPLIT = 256
MAX_SPLIT_QUERY_LEN = 8
# Fresh prompt rows this long or longer take torch's fused attention on their
# own k and v in eager steps, where those kernels run (fresh_prefill.py).
FRESH_PREFILL_MIN_TOKENS = 512


def choose_num_splits(
    num_reqs: int,
    num_kv_heads: int,
    max_query_len: int,
    max_seq_len: int,
    num_sms: int,
    max_splits: int = MAX_SPLITS,
) -> int:
    """Number of KV splits (1 = no split) for a batch, from host ints only.

    Splitting pays when the plain grid (about num_reqs * num_kv_heads programs)
    leaves SMs idle and each split still has a long run of keys: aim at two
    programs per SM, at least MIN_KEYS_PER_SPLIT keys per split. Batches with
    prefill chunks (max_query_len > MAX_SPLIT_QUERY_LEN) are never split.
    """
    if num_reqs <= 0 or max_query_len > MAX_SPLIT_QUERY_LEN:
        return 1
    programs = num_reqs * num_kv_heads
    if programs >= num_sms:
        return 1
    by_occupancy = triton.cdiv(2 * num_sms, programs)
    by_length = max_seq_len // MIN_KEYS_PER_SPLIT
    splits = min(max_splits, by_occupancy, by_length)
    return splits if splits >= 2 else 1


def wide_decode_grid(num_tokens: int, num_kv_heads: int, head_dim: int, num_sms: int) -> bool:
    """Whether a uniform decode batch's grid (a program per token and KV
    head) takes ``tile_config``'s ``wide`` tiles: from two programs an SM
    for heads of 128 dimensions or more, from three for narrower heads,
    where the A/B in benchmarks/results/README.md found them winning (below
    one program an SM, ``choose_num_splits`` splits the grid instead)."""
    per_sm = 2 if head_dim >= 128 else 3
    return num_tokens * num_kv_heads >= per_sm * num_sms


def tile_config(max_query_len: int, nqpk: int, head_dim: int,
                split: bool = False, wide: bool = False) -> dict[str, int]:
    """Kernel tile sizes for a batch: BLOCK_M rows (tokens x heads), TILE_N keys.

    Decode-like batches use the smallest tensor-core tile that holds the heads of
    a KV group and long key tiles (memory-bound: fewer, larger loads); batches with
    prefill chunks use 64 rows to reuse each K/V tile. A ``split`` decode
    batch (few rows, each split a short run of keys) takes 64-key tiles on
    two warps: a program reaches its first tile sooner, and twice as many
    programs fit on an SM. So does a ``wide`` decode batch (a grid of several
    programs an SM: ``wide_decode_grid``), three stages deep: the SMs then
    hold several programs' loads in flight at once. ``benchmarks/bench_attention.py
    --sweep`` compares the alternatives.
    """
    rows = nqpk * max(1, min(max_query_len, 64))
    block_m = min(64, max(16, triton.next_power_of_2(rows)))
    block_m = max(block_m, triton.next_power_of_2(nqpk))
    decode = max_query_len <= MAX_SPLIT_QUERY_LEN
    short = decode and (split or wide)
    tile_n = 64 if not decode or short else 128
    if head_dim > 128:
        tile_n //= 2
    num_warps = 2 if short else 4 if block_m <= 64 else 8
    num_stages = 3 if decode and wide and not split else 2
    return {"block_m": block_m, "tile_n": tile_n, "num_warps": num_warps,
            "num_stages": num_stages}


class TritonAttentionBackend:
    """Paged causal attention with GQA over a mixed batch, written in Triton.

    num_splits: None chooses per batch with choose_num_splits(); an int forces
    that many KV splits (1 never splits) for every batch, e.g. for tests or for
    a fixed CUDA-graph configuration. fresh_prefill_min_tokens: fresh prompt
    rows of at least that many tokens attend through torch's fused kernels
    (``runner.attention.fresh_prefill``); None: FRESH_PREFILL_MIN_TOKENS where
    those kernels run, never elsewhere. short_decode_keys: None takes a
    uniform decode batch's ``short_keys`` from its tuned launch (0 without
    one); an int sets it for every uniform decode batch (0: pointer tiles only).
    """

    # Grids and tiles follow the padded sizes and max_query_len alone, so a
    # mixed batch's forward can be captured at a token count (runner.cuda_graphs).
    captures_mixed_batches = True

    def __init__(self, num_splits: int | None = None, max_splits: int = MAX_SPLITS,
                 fresh_prefill_min_tokens: int | None = None,
                 short_decode_keys: int | None = None) -> None:
        if num_splits is not None and num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        if max_splits < 1:
            raise ValueError(f"max_splits must be >= 1, got {max_splits}")
        self.num_splits = num_splits
        self.max_splits = max_splits
        self.fresh_prefill_min_tokens = fresh_prefill_min_tokens
        self.short_decode_keys = short_decode_keys
        # (metadata, window, first fresh row) of the last question asked: every
        # layer of a step asks about the same metadata, so the host works it
        # out once per step and window.
        self._fresh: tuple[AttentionMetadata, int | None, int | None] | None = None
        self._counters = TicketCounters()

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        attn: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """Write k, v into kv_cache at attn.slot_mapping, then attend; returns [T, Hq, D].

        q [T, Hq, D], k and v [T, Hkv, D] (last dim contiguous, any token stride),
        kv_cache [2, num_blocks, block_size, Hkv, D]. Query head h reads KV head
        h // (Hq // Hkv). Tokens not owned by any of the num_reqs rows (padding)
        and rows with seq_len 0 produce zeros. With ``sliding_window`` W a query
        at position q sees keys k > q - W only.
        """
        _check_inputs(q, k, v, kv_cache)
        write_kv_cache(k, v, kv_cache, attn.slot_mapping)
        return self.attend(q, kv_cache, attn, scale, sliding_window)

    def attend(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        attn: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        fresh_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``forward`` for keys and values the caller already stored at
        attn.slot_mapping (the model's rotary kernel does, in the same launch).
        ``fresh_kv``: the step's rotated k and v [T, Hkv, D], given when
        ``wants_fresh_kv`` said so."""
        _check_query(q, kv_cache)
        if fresh_kv is not None:
            first = self._fresh_suffix_start(attn, sliding_window)
            if first is not None:
                return self._attend_fresh(q, kv_cache, attn, scale, fresh_kv, first)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        num_tokens, num_q_heads, head_dim = q.shape
        if num_tokens == 0:
            return out
        num_kv_heads = kv_cache.shape[3]
        nqpk = num_q_heads // num_kv_heads
        tuned = self._tuned_decode(q, attn, nqpk, num_kv_heads, sliding_window)
        if tuned is not None:
            num_splits = tuned.num_splits
            config = {**tile_config(1, nqpk, head_dim), "tile_n": tuned.tile_n,
                      "num_warps": tuned.num_warps, "num_stages": tuned.num_stages,
                      "short_keys": tuned.short_keys}
        else:
            num_splits = self._num_splits(attn, num_kv_heads, q.device, sliding_window)
            wide = attn.uniform_decode and wide_decode_grid(num_tokens, num_kv_heads, head_dim,
                                                            num_sms(q.device))
            config = tile_config(attn.max_query_len, nqpk, head_dim,
                                 split=num_splits > 1, wide=wide)
        if self.short_decode_keys is not None and attn.uniform_decode:
            config["short_keys"] = self.short_decode_keys
        # Sized on every launch, split or not: the eager warm-up before a
        # graph capture then sizes them for the capture, which may split
        # where the warm-up did not.
        counters = self._counters.at_least(
            split_counters_needed(num_tokens, attn.num_reqs, num_q_heads, num_kv_heads,
                                  config["block_m"], attn.uniform_decode), q.device)
        args = (q, kv_cache, attn.block_tables, attn.seq_lens, attn.query_start_loc,
                attn.num_reqs, scale, out)
        shape = dict(sliding_window=sliding_window, uniform_decode=attn.uniform_decode, **config)
        if num_splits == 1:
            launch_paged_attention(*args, None, **shape)
            return out
        part_shape = (num_tokens, num_q_heads, num_splits)
        f32 = {"dtype": torch.float32, "device": q.device}
        partials = SplitPartials(
            torch.empty((*part_shape, head_dim), **f32),
            torch.empty(part_shape, **f32),
            torch.empty(part_shape, **f32),
            counters,
        )
        launch_paged_attention(*args, partials, **shape)
        return out

    def _fresh_min_tokens(self, device: torch.device) -> int | None:
        if self.fresh_prefill_min_tokens is not None:
            return self.fresh_prefill_min_tokens
        return FRESH_PREFILL_MIN_TOKENS if device_ops(device).flash_kernels else None

    def wants_fresh_kv(self, attn: AttentionMetadata, sliding_window: int | None) -> bool:
        """Whether this eager step has trailing fresh prompt rows long enough
        for ``attend`` to read their own k and v (never while capturing)."""
        if is_capturing(attn.query_start_loc.device):
            return False
        return self._fresh_suffix_start(attn, sliding_window) is not None

    def _fresh_suffix_start(self, attn: AttentionMetadata,
                            sliding_window: int | None) -> int | None:
        """``fresh_suffix_start`` for this backend's threshold, once per step
        and window (None where the fused kernels do not run)."""
        cached = self._fresh
        if cached is not None and cached[0] is attn and cached[1] == sliding_window:
            return cached[2]
        min_tokens = self._fresh_min_tokens(attn.query_start_loc.device)
        first = (None if min_tokens is None
                 else fresh_suffix_start(attn, min_tokens, sliding_window))
        self._fresh = (attn, sliding_window, first)
        return first

    def _attend_fresh(self, q: torch.Tensor, kv_cache: torch.Tensor, attn: AttentionMetadata,
                      scale: float, fresh_kv: tuple[torch.Tensor, torch.Tensor],
                      first: int) -> torch.Tensor:
        """Rows ``first`` .. the last through fresh_prefill, the rows before
        them through the Triton kernels; tokens past the batch's are zeros."""
        n = attn.num_reqs
        starts = attn.query_start_loc_cpu[: n + 1].tolist()
        k, v = fresh_kv
        runs = attend_fresh_rows(q, k, v, starts[first:], scale)
        if first == 0 and len(runs) == 1 and starts[n] == q.shape[0]:
            return runs[0][1]  # the whole batch, as SDPA laid it out: no copy
        out = torch.empty_like(q)
        out[starts[n]:].zero_()
        if first > 0:
            out[: starts[first]] = self.attend(q[: starts[first]], kv_cache,
                                               leading_rows(attn, first), scale)
        for token, o in runs:
            out[token: token + o.shape[0]] = o
        return out

    def _tuned_decode(self, q: torch.Tensor, attn: AttentionMetadata, nqpk: int,
                      num_kv_heads: int, sliding_window: int | None) -> DecodeLaunch | None:
        """``tuned_decode_launch`` for a uniform decode batch of a 16-bit
        cache without a window, unless the split count is forced."""
        if (not attn.uniform_decode or self.num_splits is not None
                or sliding_window is not None or q.element_size() != 2):
            return None
        launch = tuned_decode_launch(q.shape[2], nqpk, num_kv_heads, q.shape[0],
                                     num_sms(q.device))
        if launch is None or launch.num_splits > self.max_splits:
            return None
        return launch

    def _num_splits(self, attn: AttentionMetadata, num_kv_heads: int, device,
                    sliding_window: int | None) -> int:
        if self.num_splits is not None:
            return self.num_splits
        long = attn.uniform_decode or is_capturing(device)
        max_seq_len = 1 << 30 if long else attn.max_seq_len
        if sliding_window is not None:  # no query sees more keys than the window
            max_seq_len = min(max_seq_len, sliding_window)
        return choose_num_splits(
            attn.num_reqs,
            num_kv_heads,
            attn.max_query_len,
            max_seq_len,
            num_sms(device),
            self.max_splits,
        )


def _check_inputs(q, k, v, kv_cache) -> None:
    """Raise ValueError on shapes or dtypes the kernels do not handle."""
    if k.dim() != 3 or v.dim() != 3:
        raise ValueError("expected k, v [T, Hkv, D]")
    _check_query(q, kv_cache)
    num_kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
    if k.shape != v.shape or k.shape[1:] != (num_kv_heads, head_dim) or k.shape[0] != q.shape[0]:
        raise ValueError(f"k/v shapes {tuple(k.shape)}, {tuple(v.shape)} do not fit q/kv_cache")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError("q, k, v and kv_cache must share one dtype")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("the last dim of q, k, v and kv_cache must be contiguous")


def _check_query(q, kv_cache) -> None:
    """The checks of ``_check_inputs`` that concern q and the cache alone."""
    if q.dim() != 3 or kv_cache.dim() != 5:
        raise ValueError("expected q [T, H, D] and kv_cache [2, blocks, block, Hkv, D]")
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = kv_cache.shape[3]
    if kv_cache.shape[0] != 2 or kv_cache.shape[4] != head_dim:
        raise ValueError(f"kv_cache shape {tuple(kv_cache.shape)} does not fit head_dim {head_dim}")
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"{num_q_heads} query heads not a multiple of {num_kv_heads} KV heads")
    if q.dtype != kv_cache.dtype:
        raise ValueError("q, k, v and kv_cache must share one dtype")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported dtype {q.dtype}")
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("the last dim of q, k, v and kv_cache must be contiguous")
