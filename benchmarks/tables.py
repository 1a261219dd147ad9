"""Markdown tables for the README from the benchmarks' JSON summaries.

    python -m benchmarks.tables [--results benchmarks/results]

Reads ``decode_8b.json``, ``decode_1b.json``, ``e2e_8b.json``,
``attention_prefill.json`` and ``ipc.json`` when present and prints the
README's "Measured" tables, so a rerun of the benchmarks is pasted, not
retyped. Files that are missing are skipped with a note. Decode rows timed
with ``--peer`` get the torch.compile peer's step beside tprun's.
"""

from __future__ import annotations

import argparse
import json
import os


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


def decode_table(directory: str) -> None:
    summaries = {shape: _load(directory, f"decode_{shape}.json") for shape in ("8b", "1b")}
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
    summary = _load(directory, "e2e_8b.json")
    if summary is None or "ttft" not in summary:
        return
    t = summary["ttft"]
    if "hf_host_bound" in summary:
        print(f"HF host-bound: {summary['hf_host_bound']} ({summary['hf_host_bound_reason']})\n")
    print("| TTFT | prompts x tokens | prefill FLOP floor | x floor | matmul |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {t['ttft_all_s']:.3f} s | {t['prompts']} x {t['prompt_len']} "
          f"| {t['prefill_floor_s']:.3f} s | {t['ttft_ratio_to_floor']:.2f} "
          f"| {t['matmul_tflops']:.0f} TFLOP/s |\n")


def attention_prefill_table(directory: str) -> None:
    """Prefill rows: each backend's time over SDPA's (and the kernel it ran)."""
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
        sdpa = next(iter(by.values()))["sdpa_ms"]
        cells = [f"{by[b]['ms']:.3f} ({by[b]['ratio']:.2f}, {by[b].get('path', 'triton')})"
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
    e2e_table(args.results)
    ttft_table(args.results)
    attention_prefill_table(args.results)
    ipc_table(args.results)


if __name__ == "__main__":
    main()
