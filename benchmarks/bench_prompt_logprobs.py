"""The cost of prompt logprobs: time to first token with and without them.

    python -m benchmarks.bench_prompt_logprobs --shape 8b --ttft-prompts 32 --ttft-len 2048
    python -m benchmarks.bench_prompt_logprobs --shape tiny --device cpu --dtype float32 \
        --ttft-prompts 4 --ttft-len 256 --ttft-batched-tokens 512       (smoke test)

Both runs are ``bench_e2e``'s TTFT (all prompts added at once, max_tokens=1,
a warm-up round, the median of ``--ttft-rounds``): first plain, then with
``SamplingParams(prompt_logprobs=K)``, which scores every prompt position
through the LM head chunk by chunk. Random weights of the real shape. Prints
a JSON summary last: both times and their ratio.

The second run is checked against the first: the same first tokens, and
an entry of prompt logprobs at every prompt position but the first. Their
values are the tests' to check (against transformers and the torch
reference); the summary names any difference and the exit code is 1.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from benchmarks.bench_e2e import time_to_first_token
from benchmarks.common import device_name, emit_summary
from benchmarks.shapes import SHAPES, write_shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--ttft-prompts", type=int, default=32)
    parser.add_argument("--ttft-len", type=int, default=2048)
    parser.add_argument("--ttft-rounds", type=int, default=3)
    parser.add_argument("--ttft-batched-tokens", type=int, default=8192,
                        help="max_num_batched_tokens of the runs")
    parser.add_argument("--attention-backend", default=None,
                        help="tprun's attention backend (default: the device's)")
    parser.add_argument("--k", type=int, default=1, help="prompt_logprobs of the second run")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tprun-shape-") as shape_dir:
        model_dir = write_shape(args.shape, shape_dir)
        args.prompt_logprobs = None
        plain = time_to_first_token(model_dir, args, keep_outputs=True)
        args.prompt_logprobs = args.k
        scored = time_to_first_token(model_dir, args, keep_outputs=True)
    problems = scored_differences(plain.pop("outputs"), scored.pop("outputs"))
    emit_summary({
        "benchmark": "prompt_logprobs", "shape": args.shape,
        "device": device_name(torch.device(args.device)), "dtype": args.dtype,
        "prompts": args.ttft_prompts, "prompt_len": args.ttft_len, "k": args.k,
        "ttft_plain_s": plain["ttft_all_s"], "ttft_prompt_logprobs_s": scored["ttft_all_s"],
        "ratio": round(scored["ttft_all_s"] / plain["ttft_all_s"], 3), "problems": problems,
        "date": time.strftime("%Y-%m-%d"),
    }, args.out)
    if problems:
        sys.exit(1)


def scored_differences(plain: list, scored: list) -> list[str]:
    """What the scored run's deltas (prompt order) do not share with the
    plain run's: first tokens, and an entry at every prompt position after
    the first (which has no logprob: nothing precedes it)."""
    problems = []
    for i, (a, b) in enumerate(zip(plain, scored, strict=True)):
        if a.new_token_ids != b.new_token_ids:
            problems.append(f"prompt {i}: first token {b.new_token_ids} != {a.new_token_ids}")
        entries = b.prompt_logprobs or []
        missing = [pos for pos, e in enumerate(entries) if (e is None) != (pos == 0)]
        if not entries or missing:
            problems.append(f"prompt {i}: no prompt logprobs at positions {missing[:5] or 'all'}")
    return problems[:20]


if __name__ == "__main__":
    main()
