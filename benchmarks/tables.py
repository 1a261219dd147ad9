"""Markdown tables for the README from the benchmarks' JSON summaries.

    python -m benchmarks.tables [--results benchmarks/results]

Reads ``decode_8b.json``, ``decode_1b.json`` (and their ``_full`` runs),
``tp_ab_{8b,1b}_*.json``, ``tp_8b.json``, ``tp_8b_budget8192.json``,
``e2e_8b.json``, ``attention_prefill.json`` and ``ipc.json`` when present
and prints the README's "Measured" tables, so a rerun of the
benchmarks is pasted, not retyped. Files that are missing are skipped with a
note. Decode rows timed with ``--peer`` get the torch.compile peer's step
beside tprun's.
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks import floor
from benchmarks.shapes import shape_config


def _load(directory: str, name: str) -> dict | None:
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        print(f"<!-- {name}: not found -->\n")
        return None
    with open(path) as f:
        return json.loads(f.read().strip().splitlines()[-1])


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def _has_peer(summary: dict) -> bool:
    return any("peer_step_ms" in row for row in summary["results"])


def _decode_cells(row: dict | None, peer: bool) -> list[str]:
    """tprun's step (x floor), then, with ``peer``, the peer's step (tprun / peer)."""
    if row is None or "skipped" in row:
        missing = "does not fit" if row else "-"
        return [missing, "-"] if peer else [missing]
    cells = [f"{row['step_ms']:.2f} ({row['ratio_to_floor']:.2f})"]
    if peer:
        cells.append(f"{row['peer_step_ms']:.2f} ({row['tprun_to_peer']:.2f})"
                     if "peer_step_ms" in row else "-")
    return cells


def decode_rows(summary: dict, label: str, peer: bool = False) -> list[str]:
    """One row per batch: each context's step (x floor), the peer's when
    ``peer``, and the idle shares."""
    by_batch: dict[int, dict[int, dict]] = {}
    for row in summary["results"]:
        by_batch.setdefault(row["batch"], {})[row["context"]] = row
    contexts = sorted({c for rows in by_batch.values() for c in rows})
    lines = []
    for batch, rows in sorted(by_batch.items()):
        cells = [cell for context in contexts for cell in _decode_cells(rows.get(context), peer)]
        first = rows[contexts[0]]
        between = first.get("between_steps_async", {}).get("idle_fraction")
        profiled = first.get("idle_async", {}).get("idle_fraction")
        lines.append(f"| {label} | {batch} | " + " | ".join(cells)
                     + f" | {_pct(between, 2)} / {_pct(profiled)} |")
    return lines


def _floor_note(shape: str, summary: dict) -> str | None:
    """The bandwidth a shape's floor used (None for runs that did not say)."""
    bw = summary.get("bandwidth")
    if bw is None:
        return None
    return (f"{shape.upper()}: floor at {bw['used_GBps']:.0f} GB/s ({bw['used']}; read "
            f"{bw['read_sum_GBps']} by sum, {bw['read_triton_GBps']} by Triton, copy "
            f"{bw['copy_GBps']}), {summary.get('date', '')}")


def decode_table(directory: str, suffix: str = "") -> None:
    """``decode_{8b,1b}{suffix}.json``: one row per shape and batch."""
    summaries = {shape: _load(directory, f"decode_{shape}{suffix}.json")
                 for shape in ("8b", "1b")}
    summaries = {shape: s for shape, s in summaries.items() if s is not None}
    if not summaries:
        return
    peer = any(_has_peer(s) for s in summaries.values())
    contexts = sorted({r["context"] for s in summaries.values() for r in s["results"]})
    rows = [line for shape, s in summaries.items() for line in
            decode_rows(s, shape.upper(), peer)]
    if peer:
        head = " | ".join(f"ctx {c}: tprun ms (x floor) | ctx {c}: peer ms (tprun / peer)"
                          for c in contexts)
    else:
        head = " | ".join(f"ctx {c}: ms (x floor)" for c in contexts)
    width = 2 * len(contexts) if peer else len(contexts)
    notes = [_floor_note(shape, s) for shape, s in summaries.items()]
    if any(notes):
        print("; ".join(n for n in notes if n) + "\n")
    print(f"| shape | batch | {head} | idle between steps / profiled (async) |")
    print("| --- | --- | " + " | ".join("---" for _ in range(width)) + " | --- |")
    print("\n".join(rows) + "\n")


TP_DECODE_RUNS = ("tp1", "tp2", "tp2_nccl")


def _by_batch_context(summary: dict) -> dict[tuple[int, int], dict]:
    return {(row["batch"], row["context"]): row for row in summary["results"]}


def tp_decode_table(directory: str, shape: str) -> None:
    """The decode step at TP=1, TP=2 with the custom all-reduce and TP=2 with
    NCCL (``tp_ab_{shape}_{tp1,tp2,tp2_nccl}.json``, stage ``tp-decode-ab``),
    rows by context then batch. The x floor and the speed-up (TP=1's step over
    TP=2's with the custom all-reduce) are taken from the unrounded steps."""
    runs = [_load(directory, f"tp_ab_{shape}_{run}.json") for run in TP_DECODE_RUNS]
    if any(run is None for run in runs):
        return
    tp1, custom, nccl = (_by_batch_context(run) for run in runs)
    note = _floor_note(shape, runs[1])
    if note:
        print(f"TP=2 per rank, {note}\n")
    print(f"| {shape.upper()}, batch x ctx | TP=1 | TP=2, custom all-reduce (x floor) "
          "| TP=2, NCCL | speed-up TP=2 / TP=1 |")
    print("| --- | --- | --- | --- | --- |")
    for batch, context in sorted(tp1, key=lambda key: (key[1], key[0])):
        one, two, other = (rows.get((batch, context)) for rows in (tp1, custom, nccl))
        if two is None or other is None:
            continue
        print(f"| {batch} x {context} | {one['step_ms']:.2f} "
              f"| {two['step_ms']:.2f} ({two['step_ms'] / two['floor_ms']:.2f}) "
              f"| {other['step_ms']:.2f} "
              f"| {one['step_ms'] / two['step_ms']:.2f}x |")
    print()


def _first_differing(tokens: list[int | None]) -> str:
    return ", ".join("none" if index is None else str(index) for index in tokens)


def _sync_cell(one: dict | None, many: dict | None) -> str:
    if one is None or many is None:
        return "-"
    return (f"{one['output_tokens_per_s']:.1f} / {many['output_tokens_per_s']:.1f}"
            f" ({many['output_tokens_per_s'] / one['output_tokens_per_s']:.2f}x)")


def tp_e2e_table(directory: str, shape: str = "8b", suffix: str = "") -> None:
    """End to end through ``LLM`` at TP=1 and each larger size
    (``tp_{shape}{suffix}.json``, ``bench_tp.py``): async scheduling's
    throughput, ITL and TTFT side by side, sync's throughput in the last
    column ("-" when not run), then each size's agreement with TP=1 and,
    when timed, the time to first token of the prefill-only run."""
    summary = _load(directory, f"tp_{shape}{suffix}.json")
    if summary is None:
        return
    by_tp = {row["tp"]: row for row in summary["results"]}
    base = by_tp.get(1)
    if base is None:
        print(f"<!-- tp_{shape}.json: no TP=1 run -->\n")
        return
    for tp, row in sorted(by_tp.items()):
        if tp == 1:
            continue
        print(f"| {shape.upper()}, requests | TP=1 tok/s | TP={tp} tok/s | speed-up "
              f"| ITL p50 TP=1 / TP={tp} | TTFT p50 TP=1 / TP={tp} "
              f"| sync: TP=1 / TP={tp} tok/s (speed-up) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for batch in sorted(base["speed"]["async"], key=int):
            one, many = base["speed"]["async"][batch], row["speed"]["async"][batch]
            sync_one = base["speed"].get("sync", {}).get(batch)
            sync_many = row["speed"].get("sync", {}).get(batch)
            print(f"| {batch} | {one['output_tokens_per_s']:.1f} "
                  f"| {many['output_tokens_per_s']:.1f} "
                  f"| {many['output_tokens_per_s'] / one['output_tokens_per_s']:.2f}x "
                  f"| {one['itl_ms_p50']:.1f} / {many['itl_ms_p50']:.1f} ms "
                  f"| {one['ttft_ms_p50']:.0f} / {many['ttft_ms_p50']:.0f} ms "
                  f"| {_sync_cell(sync_one, sync_many)} |")
        print(f"\nTP={tp} against TP=1, first differing greedy token per prompt: "
              f"{_first_differing(row['first_differing_token'])}; largest logprob gap before "
              f"it {row['max_logprob_gap']:.3f} ({summary.get('date', '')})\n")
        if "ttft" in base and "ttft" in row:
            one, many = base["ttft"]["ttft_all_s"], row["ttft"]["ttft_all_s"]
            print(f"Time to first token, {row['ttft']['prompts']} prompts x "
                  f"{row['ttft']['prompt_len']} tokens at once "
                  f"(max_num_batched_tokens {row['ttft']['max_num_batched_tokens']}): "
                  f"TP=1 {one:.3f} s, TP={tp} {many:.3f} s ({one / many:.2f}x)\n")


def e2e_table(directory: str) -> None:
    summary = _load(directory, "e2e_8b.json")
    if summary is None:
        return
    hf, same, everything = summary["hf"], summary["tprun_same_batch"], summary["tprun_all"]
    print("| HF batch 32 | tprun, batch 32 | ratio | tprun, all at once |")
    print("| --- | --- | --- | --- |")
    print(f"| {hf['output_tokens_per_s']} tok/s ({hf['decode_step_ms']:.1f} ms/step) "
          f"| {same['output_tokens_per_s']} tok/s, ITL p50 {same['itl_ms_p50']:.1f} ms "
          f"| {summary['throughput_ratio_same_batch']}x "
          f"| {everything['output_tokens_per_s']} tok/s, TTFT p50 "
          f"{everything['ttft_ms_p50'] / 1e3:.2f} s, ITL p50 {everything['itl_ms_p50']:.1f} / "
          f"p99 {everything['itl_ms_p99']:.0f} ms |\n")


def ttft_table(directory: str) -> None:
    """The TTFT row, its floor computed by benchmarks/floor.py from the run's
    shape, prompts and measured matmul throughput (the burst's; the rate held
    over a longer run beside it where the file has it)."""
    summary = _load(directory, "e2e_8b.json")
    if summary is None or "ttft" not in summary:
        return
    t = summary["ttft"]
    flops = floor.prefill_flops(shape_config(summary["shape"]), t["prompts"], t["prompt_len"])
    floor_s = floor.prefill_flop_floor_s(flops, t["matmul_tflops"])
    if "hf_host_bound" in summary:
        print(f"HF host-bound: {summary['hf_host_bound']} ({summary['hf_host_bound_reason']})\n")
    sustained = t.get("matmul_tflops_sustained")
    held = "-" if sustained is None else (
        f"{sustained:.0f} TFLOP/s "
        f"({t['ttft_all_s'] / floor.prefill_flop_floor_s(flops, sustained):.2f})")
    print("| TTFT | prompts x tokens | prefill FLOP floor | x floor | matmul "
          "| matmul held (TTFT x its time) |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {t['ttft_all_s']:.3f} s | {t['prompts']} x {t['prompt_len']} "
          f"| {floor_s:.3f} s | {t['ttft_all_s'] / floor_s:.2f} "
          f"| {t['matmul_tflops']:.0f} TFLOP/s | {held} |\n")


def attention_prefill_table(directory: str) -> None:
    """Prefill rows: each backend's time over SDPA's timed the same way (and
    the kernel it ran; "eager" where both were timed without a CUDA graph)."""
    summary = _load(directory, "attention_prefill.json")
    if summary is None:
        return
    rows: dict[str, dict[str, dict]] = {}
    for row in summary["results"]:
        if row["name"] == "prefill":
            rows.setdefault(row["shape"], {})[row.get("backend", "triton")] = row
    backends = sorted({b for by in rows.values() for b in by})
    print("| prefill | SDPA ms | " + " | ".join(f"{b}: ms (x SDPA)" for b in backends) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in backends) + " |")
    for shape, by in rows.items():
        sdpa = next((r for r in by.values() if r.get("timed") != "eager"),
                    next(iter(by.values())))["sdpa_ms"]
        cells = [f"{by[b]['ms']:.3f} ({by[b]['ratio']:.2f}, {by[b].get('path', 'triton')}"
                 + (", eager)" if by[b].get("timed") == "eager" else ")")
                 if b in by else "-" for b in backends]
        print(f"| {shape} | {sdpa:.3f} | " + " | ".join(cells) + " |")
    print()


def ipc_table(directory: str) -> None:
    summary = _load(directory, "ipc.json")
    if summary is None:
        return
    print("| transport | TP | tprun / bare pyzmq, median |")
    print("| --- | --- | --- |")
    for row in summary["results"]:
        print(f"| {row['transport']} | {row['tp']} | {row['ipc_us']['median']:.0f} / "
              f"{row['bare_us']['median']:.0f} us ({row['ratio_median']:.2f}x) |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    decode_table(args.results)
    decode_table(args.results, "_full")
    tp_decode_table(args.results, "8b")
    tp_decode_table(args.results, "1b")
    tp_e2e_table(args.results, "8b")
    tp_e2e_table(args.results, "8b", "_budget8192")
    e2e_table(args.results)
    ttft_table(args.results)
    attention_prefill_table(args.results)
    ipc_table(args.results)


if __name__ == "__main__":
    main()
