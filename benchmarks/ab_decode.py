"""A/B of the decode step between a git revision and the working tree, in one run.

    python -m benchmarks.ab_decode --base HEAD --pairs 2 --out-dir /tmp/ab -- \\
        --shape 8b --batches 1 8 32 --contexts 512 4096

Exports ``--base`` (any revision of this repository) with ``git archive``
into a temporary directory (or takes ``--base`` as such a tree where it names
a directory), then runs ``benchmarks.bench_decode`` with the
arguments after ``--`` alternately in that tree and in the working tree:
base, change, base, change ... (``--pairs`` pairs), each run a process of
its own, so that both trees see the device in the same state and a drift
over the session shows as a drift of both. Each run's JSON goes to
``--out-dir`` as ``base_<i>.json`` / ``change_<i>.json``. Prints, per row
(shape, batch, context), every run's step ms in run order and the change's
median over the base's (``change/base``), then a JSON summary. A run that
fails (its exit code: a row whose tokens differ from eager steps, or a
crash) stops the A/B with that run named.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def export_tree(revision: str, into: str) -> None:
    """The files of ``revision`` (committed ones only) under ``into``."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", revision],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)


def base_tree(base: str, scratch: str) -> str:
    """The tree to run the base from: ``base`` itself where it is a
    directory, else revision ``base`` exported into ``scratch``."""
    if os.path.isdir(base):
        return base
    export_tree(base, scratch)
    return scratch


def run_decode(tree: str, out: str, bench_args: list[str]) -> None:
    """bench_decode from ``tree`` with ``bench_args``, its JSON to ``out``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [tree, *filter(None, [os.environ.get("PYTHONPATH")])]))
    result = subprocess.run([sys.executable, "-m", "benchmarks.bench_decode", *bench_args,
                             "--out", out], cwd=tree, env=env)
    if result.returncode != 0:
        raise SystemExit(f"ab_decode: {out}: bench_decode exited with {result.returncode}")


def step_ms(path: str) -> dict[tuple, float]:
    """(shape, batch, context) -> step ms of the rows a run timed."""
    with open(path) as f:
        summary = json.load(f)
    return {(r["shape"], r["batch"], r["context"]): r["step_ms"]
            for r in summary["results"] if "step_ms" in r}


def compare(runs: list[tuple[str, dict[tuple, float]]]) -> list[dict]:
    """Per row timed by every run: the runs' step ms in order, each side's
    median and change/base."""
    rows = set.intersection(*(set(times) for _, times in runs))
    table = []
    for key in sorted(rows):
        by_side = {side: [t[key] for s, t in runs if s == side] for side in ("base", "change")}
        base, change = (statistics.median(by_side[s]) for s in ("base", "change"))
        table.append({"shape": key[0], "batch": key[1], "context": key[2],
                      "runs": [[side, times[key]] for side, times in runs],
                      "base_ms": base, "change_ms": change,
                      "change_over_base": round(change / base, 4)})
    return table


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, bench_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="HEAD",
                        help="the git revision to compare against, or a directory that holds "
                             "an exported tree (where the checkout has no .git)")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(own)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    if "--out" in bench_args:
        parser.error("bench_decode's --out is ab_decode's to set (--out-dir)")
    os.makedirs(args.out_dir, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tprun-ab-base-") as scratch:
        base = base_tree(args.base, scratch)
        for i in range(args.pairs):
            for side, tree in (("base", base), ("change", ROOT)):
                out = os.path.join(args.out_dir, f"{side}_{i}.json")
                run_decode(tree, out, bench_args)
                runs.append((side, step_ms(out)))
    table = compare(runs)
    for row in table:
        order = " / ".join(f"{ms:.4f}" for _, ms in row["runs"])
        print(f"{row['shape']} b{row['batch']} x {row['context']}: {order} ms "
              f"(base, change, ...): change/base {row['change_over_base']:.4f}")
    print(json.dumps({"benchmark": "ab_decode", "base": args.base, "pairs": args.pairs,
                      "bench_decode_args": bench_args, "rows": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
