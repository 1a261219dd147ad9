"""Benchmark the Triton paged-attention backend against torch SDPA.

    python -m benchmarks.bench_attention [--out benchmarks/results/attention.json]
    python -m benchmarks.bench_attention --prefill-only --backend all
    python -m benchmarks.bench_attention --smoke      # tiny shapes; runs on CPU too
    python -m benchmarks.bench_attention --tune-decode  # runner/attention/tuned_decode.py

Shapes (CUDA): Llama-3-8B heads (32 query heads, 8 KV heads, head dim 128), bf16,
block size 16. Decode: batch x context with one query token per request; prefill:
batch x prompt tokens, causal, empty cache, and one prompt after a cached prefix
of 4096 tokens (chunked prefill, prefix caching). Prefill rows are timed for
``--backend``: "triton" (the Triton kernels) and "triton_flash_prefill"
(runner/attention/flash_prefill.py: prefill rows through torch's
FlashAttention over K/V gathered from the cache, decodes through Triton; its
"path" field names the kernel that ran). Our time is one full forward() (KV
write of the step's tokens + attention) with the split count the backend's
heuristic picks for the real max_seq_len; for decode the no-split time is
reported too. Both sides are timed as CUDA-graph replays (do_bench_cudagraph),
so host launch overhead is left out of both.

SDPA baseline, on dense contiguous K/V of the same values:
  decode: q [B, Hkv, Hq/Hkv, D] against K/V [B, Hkv, L, D], no mask; the query
    heads of a KV group sit in the query-length axis, which is exact for a
    single query token at the last position and needs no K/V expansion;
  prefill: q [B, Hq, L, D], K/V [B, Hq, P + L, D] (repeated per query head
    beforehand, outside the timing), causal (bottom-right aligned when P > 0).
Every case also checks our output against SDPA's (max_abs_err).

Prints a table, then, last, one JSON object with all results.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

if "--smoke" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.testing  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

from benchmarks.common import emit_summary  # noqa: E402
from runner.attention.flash_prefill import (  # noqa: E402
    FlashPrefillBackend,
    default_prefill_kernel,
)
from runner.attention.metadata import AttentionMetadata  # noqa: E402
from runner.attention.triton_attn import (  # noqa: E402
    TritonAttentionBackend,
    choose_num_splits,
    tile_config,
    wide_decode_grid,
)
from runner.attention.triton_kv_write import write_kv_cache  # noqa: E402
from runner.attention.triton_split_merge import SplitPartials  # noqa: E402
from runner.attention.triton_unified import (  # noqa: E402
    launch_paged_attention,
    split_counters_needed,
)
from runner.ops import num_sms  # noqa: E402


def make_metadata(query_lens, seq_lens, block_tables, slot_mapping) -> AttentionMetadata:
    device = block_tables.device
    starts = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    starts[1:] = torch.tensor(query_lens, dtype=torch.int32).cumsum(0)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    return AttentionMetadata(
        num_reqs=len(query_lens),
        num_tokens=int(starts[-1]),
        num_decodes=sum(1 for n in query_lens if n == 1),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_start_loc=starts.to(device),
        seq_lens=seq.to(device),
        block_tables=block_tables,
        slot_mapping=slot_mapping,
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq,
    )


def paged_case(batch, context, q_len, heads, block_size, dtype, device):
    """Random paged cache holding `context` keys per request in shuffled blocks.

    Returns (q, k, v, kv_cache, attn, dense_k, dense_v) where dense_* are the
    [B, Hkv, L, D] contiguous copies of each request's cached keys/values, taken
    after the step's own k/v are written (so both sides see the same values).
    """
    num_q_heads, num_kv_heads, head_dim = heads
    blocks_per_req = triton.cdiv(context, block_size)
    num_blocks = batch * blocks_per_req
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim,
                           dtype=dtype, device=device)
    block_tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_req)
    block_tables = block_tables.to(torch.int32)
    positions = torch.arange(context - q_len, context, device=device)
    slots = block_tables[:, positions // block_size].long() * block_size + positions % block_size
    tokens = batch * q_len
    q = torch.randn(tokens, num_q_heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
    v = torch.randn(tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
    attn = make_metadata([q_len] * batch, [context] * batch, block_tables, slots.reshape(-1))
    return q, k, v, kv_cache, attn


def dense_kv(kv_cache, block_tables, context, which):
    """[B, Hkv, L, D] contiguous copy of each request's cached keys (0) or values (1)."""
    batch = block_tables.shape[0]
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    dense = torch.empty(batch, num_kv_heads, context, head_dim,
                        dtype=kv_cache.dtype, device=kv_cache.device)
    for b in range(batch):
        pages = kv_cache[which, block_tables[b].long()].reshape(-1, num_kv_heads, head_dim)
        dense[b] = pages[:context].transpose(0, 1)
    return dense


def time_ms(fn, device, reps, graph: bool = True):
    """Mean ms of ``fn``: replays of a CUDA graph of it on CUDA (no launch
    gaps), or with ``graph=False`` eager calls (for a path that only eager
    steps take); three host-timed calls elsewhere."""
    if device == "cuda":
        if not graph:
            return triton.testing.do_bench(fn, rep=reps)
        return triton.testing.do_bench_cudagraph(fn, rep=reps)
    fn()
    start = time.perf_counter()
    for _ in range(3):
        fn()
    return (time.perf_counter() - start) / 3 * 1e3


def bench_decode(batch, context, heads, block_size, dtype, device, reps):
    num_q_heads, num_kv_heads, head_dim = heads
    q, k, v, kv_cache, attn = paged_case(batch, context, 1, heads, block_size, dtype, device)
    scale = head_dim**-0.5
    splits = choose_num_splits(batch, num_kv_heads, 1, context, num_sms(torch.device(device)))
    backend = TritonAttentionBackend(num_splits=splits)
    out = backend.forward(q, k, v, kv_cache, attn, scale)
    dense_k = dense_kv(kv_cache, attn.block_tables, context, 0)
    dense_v = dense_kv(kv_cache, attn.block_tables, context, 1)
    group = num_q_heads // num_kv_heads
    q_sdpa = q.view(batch, num_kv_heads, group, head_dim)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(
            q_sdpa, dense_k, dense_v, scale=scale
        )

    err = (out.float() - sdpa().reshape(out.shape).float()).abs().max().item()
    ms = time_ms(lambda: backend.forward(q, k, v, kv_cache, attn, scale), device, reps)
    ms_plain = ms
    if splits > 1:
        plain = TritonAttentionBackend(num_splits=1)
        ms_plain = time_ms(lambda: plain.forward(q, k, v, kv_cache, attn, scale), device, reps)
    sdpa_ms = time_ms(sdpa, device, reps)
    return {"num_splits": splits, "ms": ms, "ms_nosplit": ms_plain, "sdpa_ms": sdpa_ms,
            "max_abs_err": err}


PREFILL_BACKENDS = ("triton", "triton_fresh", "triton_flash_prefill")


def prefill_backend(name: str):
    """The backend a prefill row times: plain Triton (the paged kernels
    alone), the default Triton backend as the model calls it (``triton_fresh``:
    fresh prompts on their own k and v, runner/attention/fresh_prefill.py), or
    Triton with prefill rows sent to torch's flash kernels
    (runner/attention/flash_prefill.py): ``triton_flash_prefill`` with the
    kernel it picks on this torch, or ``triton_flash_prefill:KERNEL`` (varlen,
    sdpa) with that one."""
    if name == "triton":
        return TritonAttentionBackend(fresh_prefill_min_tokens=1 << 30)
    if name == "triton_fresh":
        return _FreshAsTheModelCalls(TritonAttentionBackend())
    _, _, kernel = name.partition(":")
    return FlashPrefillBackend(prefill_kernel=kernel or None)


class _FreshAsTheModelCalls:
    """``forward`` as the model runs it: the KV write (the model's rotary
    kernel does it), then ``attend`` with the step's own k and v where the
    backend wants them."""

    def __init__(self, backend: TritonAttentionBackend):
        self.backend = backend

    def forward(self, q, k, v, kv_cache, attn, scale):
        write_kv_cache(k, v, kv_cache, attn.slot_mapping)
        return self.attend(q, k, v, kv_cache, attn, scale)

    def attend(self, q, k, v, kv_cache, attn, scale):
        """The backend's part alone: in the model the rotary kernel writes
        the cache, in the launch that rotates k."""
        fresh = self.backend.wants_fresh_kv(attn, None)
        return self.backend.attend(q, kv_cache, attn, scale,
                                   fresh_kv=(k, v) if fresh else None)

    def path(self, attn) -> str:
        return "sdpa_fresh" if self.backend.wants_fresh_kv(attn, None) else "triton"


def bench_prefill(batch, length, prefix, heads, block_size, dtype, device, reps, backends):
    """Causal prefill of ``length`` tokens per request after ``prefix`` cached
    ones; one row per backend, each against SDPA on dense K/V (bottom-right
    causal mask when there is a prefix)."""
    num_q_heads, num_kv_heads, head_dim = heads
    context = prefix + length
    q, k, v, kv_cache, attn = paged_case(batch, context, length, heads, block_size, dtype,
                                         device)
    scale = head_dim**-0.5
    outs = {name: prefill_backend(name).forward(q, k, v, kv_cache, attn, scale)
            for name in backends}
    group = num_q_heads // num_kv_heads
    q_sdpa = q.view(batch, length, num_q_heads, head_dim).transpose(1, 2).contiguous()
    k_sdpa, v_sdpa = (dense_kv(kv_cache, attn.block_tables, context, which)
                      .repeat_interleave(group, dim=1) for which in (0, 1))
    mask = causal_lower_right(length, context) if prefix else None

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(
            q_sdpa, k_sdpa, v_sdpa, attn_mask=mask, is_causal=mask is None, scale=scale)

    want = sdpa().transpose(1, 2).reshape(q.shape).float()
    # SDPA timed the way each row is: in a CUDA graph, or eagerly for the
    # fresh path (eager steps only take it).
    sdpa_ms = {graph: time_ms(sdpa, device, reps, graph=graph) for graph in (True, False)}
    rows = []
    for name in backends:
        backend = prefill_backend(name)
        graph = name != "triton_fresh"
        ms = time_ms(lambda b=backend: b.forward(q, k, v, kv_cache, attn, scale), device, reps,
                     graph=graph)
        path = ("triton" if name == "triton" else backend.path(attn) if name == "triton_fresh"
                else backend.kernel_for(q, attn, scale, None)[0])
        row = {"backend": name, "path": path, "num_splits": 1, "ms": ms,
               "sdpa_ms": sdpa_ms[graph], "timed": "cuda graph" if graph else "eager",
               "max_abs_err": (outs[name].float() - want).abs().max().item()}
        if name == "triton_fresh":  # as the model calls it: the KV write is rotary's
            row["ms_with_kv_write"] = ms
            row["ms"] = time_ms(lambda b=backend: b.attend(q, k, v, kv_cache, attn, scale),
                                device, reps, graph=False)
        rows.append(row)
    return rows


def attention_only(q, kv_cache, attn, num_splits, config):
    """A closure running just the attention launch (no KV write) with a fixed config."""
    out = torch.empty_like(q)
    shape = (*q.shape[:2], num_splits)
    partials = None
    if num_splits > 1:
        f32 = {"dtype": torch.float32, "device": q.device}
        counters = split_counters_needed(q.shape[0], attn.num_reqs, q.shape[1],
                                         kv_cache.shape[3], config["block_m"],
                                         attn.uniform_decode)
        partials = SplitPartials(torch.empty(*shape, q.shape[2], **f32),
                                 torch.empty(shape, **f32), torch.empty(shape, **f32),
                                 torch.zeros(counters, dtype=torch.int32, device=q.device))

    def run():
        launch_paged_attention(q, kv_cache, attn.block_tables, attn.seq_lens,
                               attn.query_start_loc, attn.num_reqs, 0.1, out, partials,
                               uniform_decode=attn.uniform_decode, **config)

    return run


def sweep(heads, block_size, dtype, device, smoke, with_decode=True):
    """Time tile configs and split counts (decode rows only ``with_decode``);
    returns rows {name, shape, config, ms}. Decode rows are uniform decode
    batches, each with the split count a decode graph captures (long
    contexts assumed), 1 and 2, over key tiles x warps x stages; their
    ``GBps`` is the batch's KV over the time."""
    nqpk = heads[0] // heads[1]
    if smoke:
        decode, prefill, tiles = [(1, 256)], [(1, 64)], [(64, 32, 4, 2)]
        decode_tiles = [(32, 4, 2)]
    else:
        decode = [(1, 512), (8, 512), (16, 512), (32, 512), (64, 512), (8, 4096), (32, 2048),
                  (64, 2048), (64, 4096)]
        prefill = [(1, 4096), (4, 1024)]
        tiles = [(bm, tn, w, st) for bm in (64, 128) for tn in (64, 128) for w in (4, 8)
                 for st in (2, 3, 4)]
        decode_tiles = [(tn, w, st) for tn in (32, 64, 128) for w in (2, 4, 8) for st in (1, 2, 3)]
    if not with_decode:
        decode = []
    rows = []
    sms = num_sms(torch.device(device))
    for batch, context in decode:
        q, _, _, kv_cache, attn = paged_case(batch, context, 1, heads, block_size, dtype, device)
        captured = choose_num_splits(batch, heads[1], 1, 1 << 30, sms)
        kv_gb = batch * context * heads[1] * heads[2] * 2 * q.element_size() / 1e9
        for tile_n, warps, stages in decode_tiles:
            config = {**tile_config(1, nqpk, heads[2]), "tile_n": tile_n, "num_warps": warps,
                      "num_stages": stages}
            for n in sorted({captured, 1, 2}):
                ms = time_ms(attention_only(q, kv_cache, attn, n, config), device, 20)
                rows.append({"name": "decode", "shape": f"{batch}x{context}",
                             "config": {**config, "num_splits": n}, "ms": ms,
                             "GBps": kv_gb / ms * 1e3})
        del q, kv_cache, attn
    for batch, length in prefill:
        q, _, _, kv_cache, attn = paged_case(batch, length, length, heads, block_size, dtype,
                                             device)
        for block_m, tile_n, warps, stages in tiles:
            config = {"block_m": block_m, "tile_n": tile_n, "num_warps": warps,
                      "num_stages": stages}
            try:
                ms = time_ms(attention_only(q, kv_cache, attn, 1, config), device, 20)
            except triton.runtime.errors.OutOfResources as e:  # shared memory, registers
                print(f"sweep prefill {batch}x{length} {config}: {e}")
                continue
            rows.append({"name": "prefill", "shape": f"{batch}x{length}", "config": config,
                         "ms": ms})
    for shape in dict.fromkeys((r["name"], r["shape"]) for r in rows):
        best = min((r for r in rows if (r["name"], r["shape"]) == shape), key=lambda r: r["ms"])
        print(f"sweep best {shape[0]} {shape[1]}: {best['ms']:.4f} ms {best['config']}")
    return rows


# Decode launches --tune-decode tries: (splits) x (key tile, warps, stages).
TUNE_SPLITS = (1, 2, 3, 4, 8, 16, 32)
TUNE_TILES = ((32, 2, 2), (32, 2, 3), (64, 2, 2), (64, 2, 3), (64, 4, 3), (128, 4, 2), (128, 4, 3))
TUNE_BATCHES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
TUNE_CONTEXTS = (512, 4096)
TUNE_HEADS = ((32, 8, 128), (32, 8, 64))  # Llama-3.1-8B and Llama-3.2-1B at TP=1


def _time_launch(q, kv_cache, attn, launch, device, reps):
    """ms of one attention launch (``launch``: a tile config with its num_splits)."""
    config = dict(launch)
    splits = config.pop("num_splits")
    return time_ms(attention_only(q, kv_cache, attn, splits, config), device, reps)


def tune_decode(block_size, dtype, device, smoke):
    """Every decode launch of TUNE_SPLITS x TUNE_TILES (splits up to eight
    programs an SM) for each head shape and batch at both contexts, attention
    alone as graph replays (contiguous block tables, as a fresh cache hands
    out). Each context's five fastest and the rules' launch are timed twice
    more and keep their best. A launch's score is its time over the context's
    best, summed over the contexts; the lowest score wins and is printed as a
    ``TUNED_DECODE`` line. Returns the rows."""
    heads_list, batches, contexts = TUNE_HEADS, TUNE_BATCHES, TUNE_CONTEXTS
    if smoke:
        heads_list, batches, contexts = ((4, 2, 64),), (1, 2), (64, 200)
    sms = num_sms(torch.device(device))
    rows = []
    for heads in heads_list:
        num_q_heads, num_kv_heads, head_dim = heads
        nqpk = num_q_heads // num_kv_heads
        for batch in batches:
            rules_splits = choose_num_splits(batch, num_kv_heads, 1, 1 << 30, sms)
            rules = {**tile_config(1, nqpk, head_dim, split=rules_splits > 1,
                                   wide=wide_decode_grid(batch, num_kv_heads, head_dim, sms)),
                     "num_splits": rules_splits}
            launches = {"rules": rules}
            for splits in TUNE_SPLITS:
                if splits > 1 and batch * num_kv_heads * splits > 8 * sms:
                    continue
                for tile_n, warps, stages in TUNE_TILES:
                    launches[f"{splits}/{tile_n}/{warps}/{stages}"] = {
                        **tile_config(1, nqpk, head_dim), "tile_n": tile_n, "num_warps": warps,
                        "num_stages": stages, "num_splits": splits}
            times = {}
            for context in contexts:
                case = paged_case(batch, context, 1, heads, block_size, dtype, device)
                q, kv_cache, attn = case[0], case[3], case[4]
                blocks = kv_cache.shape[1]
                attn.block_tables.copy_(torch.arange(blocks, device=device, dtype=torch.int32)
                                        .view(attn.block_tables.shape))
                first = {name: _time_launch(q, kv_cache, attn, launch, device, 10)
                         for name, launch in launches.items()}
                again = dict.fromkeys(["rules", *sorted(first, key=first.get)[:5]])
                times[context] = {**first, **{
                    name: min(first[name], *(_time_launch(q, kv_cache, attn, launches[name],
                                                          device, 20) for _ in range(2)))
                    for name in again}}
                del case, q, kv_cache, attn
            score = {name: sum(times[c][name] / min(times[c].values()) for c in contexts)
                     for name in launches}
            winner = min(score, key=score.get)
            launch = launches[winner]
            print(f"    ({head_dim}, {nqpk}, {num_kv_heads}, {batch}): DecodeLaunch("
                  f"{launch['num_splits']}, {launch['tile_n']}, {launch['num_warps']}, "
                  f"{launch['num_stages']}),  # us at {'/'.join(map(str, contexts))}: "
                  + "/".join(f"{times[c][winner] * 1e3:.2f}" for c in contexts) + ", rules "
                  + "/".join(f"{times[c]['rules'] * 1e3:.2f}" for c in contexts))
            rows.append({"heads": heads, "batch": batch, "winner": launch,
                         "rules": rules, "score": score,
                         "ms": {str(c): times[c] for c in contexts}})
    return rows


def fits(batch, context, heads, block_size, dtype, device) -> bool:
    """Paged cache + dense SDPA copies, with headroom, must fit in free memory."""
    if device != "cuda":
        return True
    _, num_kv_heads, head_dim = heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    cache = 2 * batch * triton.cdiv(context, block_size) * block_size * num_kv_heads * head_dim
    need = 2.3 * cache * itemsize
    free, _ = torch.cuda.mem_get_info()
    return need < free


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter)")
    parser.add_argument("--out", help="also write the JSON results to this path")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--reps", type=int, default=50, help="ms of replays per timing (CUDA)")
    parser.add_argument("--sweep", action="store_true", help="also sweep tile configs / splits")
    parser.add_argument("--backend", default="all", choices=(*PREFILL_BACKENDS, "all"),
                        help="backend of the prefill rows (all: one row each)")
    parser.add_argument("--prefill-only", action="store_true",
                        help="skip the decode rows (of the sweep too)")
    parser.add_argument("--tune-decode", action="store_true",
                        help="only time decode launches for runner/attention/tuned_decode.py")
    parser.add_argument("--prefill-kernels", nargs="+", choices=("varlen", "sdpa"),
                        help="time triton_flash_prefill once per kernel named here "
                             "(default: once, with the kernel it picks)")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        parser.error("without CUDA only --smoke runs")
    if args.smoke:
        heads, dtype = (4, 2, 64), torch.float32 if device == "cpu" else torch.bfloat16
        decode = [(1, 64), (2, 600)]
        prefill = [(1, 64, 0), (2, 32, 0), (1, 32, 48)]
    else:
        heads, dtype = (32, 8, 128), torch.bfloat16
        decode = [(b, c) for b in (1, 8, 32, 128, 256) for c in (512, 2048, 8192, 32768)]
        prefill = [(1, 4096, 0), (4, 1024, 0), (1, 8192, 0), (1, 4096, 4096)]

    if args.tune_decode:
        emit_summary({"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                      "dtype": str(dtype).removeprefix("torch."), "block_size": args.block_size,
                      "torch": torch.__version__,
                      "tune_decode": tune_decode(args.block_size, dtype, device, args.smoke)},
                     args.out)
        return
    backends = PREFILL_BACKENDS if args.backend == "all" else (args.backend,)
    if args.prefill_kernels and "triton_flash_prefill" in backends:
        backends = [b for b in backends if b != "triton_flash_prefill"]
        backends += [f"triton_flash_prefill:{kernel}" for kernel in args.prefill_kernels]
    results = []
    header = f"{'case':<8}{'shape':>16}{'backend':>29}{'splits':>8}{'ms':>10}{'nosplit':>10}"
    print(header + f"{'sdpa_ms':>10}{'ratio':>8}{'err':>10}")
    cases = [] if args.prefill_only else [("decode", b, c, 0) for b, c in decode]
    cases += [("prefill", b, n, p) for b, n, p in prefill]
    for name, batch, length, prefix in cases:
        shape = f"{batch}x{length}" + (f"+{prefix} cached" if prefix else "")
        if not fits(batch, prefix + length, heads, args.block_size, dtype, device):
            print(f"{name:<8}{shape:>16}  skipped: does not fit in free memory")
            continue
        if name == "decode":
            rows = [{"backend": "triton", **bench_decode(batch, length, heads, args.block_size,
                                                         dtype, device, args.reps)}]
        else:
            rows = bench_prefill(batch, length, prefix, heads, args.block_size, dtype, device,
                                 args.reps, backends)
        for row in rows:
            row = {"name": name, "shape": shape, **row, "ratio": row["ms"] / row["sdpa_ms"]}
            results.append(row)
            print(f"{name:<8}{shape:>16}{row['backend']:>29}{row['num_splits']:>8}"
                  f"{row['ms']:>10.4f}{row.get('ms_nosplit', row['ms']):>10.4f}"
                  f"{row['sdpa_ms']:>10.4f}{row['ratio']:>8.2f}{row['max_abs_err']:>10.2e}")
        if device == "cuda":
            torch.cuda.empty_cache()

    report = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
        "dtype": str(dtype).removeprefix("torch."),
        "heads": {"num_q_heads": heads[0], "num_kv_heads": heads[1], "head_dim": heads[2]},
        "block_size": args.block_size,
        "tile_config_decode": tile_config(1, heads[0] // heads[1], heads[2]),
        "tile_config_prefill": tile_config(4096, heads[0] // heads[1], heads[2]),
        "torch": torch.__version__,
        "flash_prefill_kernel": default_prefill_kernel(torch.device(device)),
        "results": results,
    }
    if args.sweep:
        report["sweep"] = sweep(heads, args.block_size, dtype, device, args.smoke,
                                with_decode=not args.prefill_only)
    emit_summary(report, args.out)


if __name__ == "__main__":
    main()
