"""Markdown tables for the README from the benchmarks' JSON summaries.

    python benchmarks/tables.py [--results benchmarks/results]

Reads ``decode_8b.json``, ``decode_1b.json``, ``e2e_8b.json`` and
``ipc.json`` when present and prints the README's "Measured" tables, so a
session that re-runs the benchmarks pastes numbers instead of retyping them.
Files that are missing are skipped with a note.
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


def decode_rows(summary: dict, label: str) -> list[str]:
    """One row per batch: both contexts' step (x floor) and the idle shares."""
    by_batch: dict[int, dict[int, dict]] = {}
    for row in summary["results"]:
        by_batch.setdefault(row["batch"], {})[row["context"]] = row
    contexts = sorted({c for rows in by_batch.values() for c in rows})
    lines = []
    for batch, rows in sorted(by_batch.items()):
        cells = []
        for context in contexts:
            row = rows.get(context)
            if row is None or "skipped" in row:
                cells.append("does not fit" if row else "-")
            else:
                cells.append(f"{row['step_ms']:.2f} ({row['ratio_to_floor']:.2f})")
        first = rows[contexts[0]]
        between = first.get("between_steps_async", {}).get("idle_fraction")
        profiled = first.get("idle_async", {}).get("idle_fraction")
        lines.append(f"| {label} | {batch} | " + " | ".join(cells)
                     + f" | {_pct(between, 2)} / {_pct(profiled)} |")
    return lines


def decode_table(directory: str) -> None:
    rows, contexts = [], None
    for shape in ("8b", "1b"):
        summary = _load(directory, f"decode_{shape}.json")
        if summary is None:
            continue
        contexts = sorted({r["context"] for r in summary["results"]})
        rows += decode_rows(summary, shape.upper())
    if not rows:
        return
    head = " | ".join(f"ctx {c}: ms (x floor)" for c in contexts)
    print(f"| shape | batch | {head} | idle between steps / profiled (async) |")
    print("| --- | --- | " + " | ".join("---" for _ in contexts) + " | --- |")
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
    ipc_table(args.results)


if __name__ == "__main__":
    main()
