"""The cost of prompt logprobs: time to first token with and without them.

    python -m benchmarks.bench_prompt_logprobs --shape 8b --ttft-prompts 32 --ttft-len 2048
    python -m benchmarks.bench_prompt_logprobs --shape tiny --device cpu --dtype float32 \
        --ttft-prompts 4 --ttft-len 256 --ttft-batched-tokens 512       (smoke test)

Both runs are ``bench_e2e``'s TTFT (all prompts added at once, max_tokens=1,
a warm-up round, the median of ``--ttft-rounds``): first plain, then with
``SamplingParams(prompt_logprobs=K)``, which scores every prompt position
through the LM head chunk by chunk. Random weights of the real shape. Prints
a JSON summary last: both times and their ratio.

``--reference`` adds a third run in the same process with the logprobs
by the torch reference instead of their kernel
(``runner.sampling.logprobs.LOGPROBS_TRITON`` off; the engine runs in
process at TP 1), and checks the second against it: the same first
tokens, and at every prompt position the same number of entries with
logprobs within ``LOGPROB_ATOL`` (the kernel sums in another order; a tie
for the top token may name another id of the same value, so entries are
compared by value).
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
from runner.sampling import logprobs


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
    parser.add_argument("--reference", action="store_true",
                        help="also time the prompt logprobs through the torch reference")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    reference = {}
    with tempfile.TemporaryDirectory(prefix="tprun-shape-") as shape_dir:
        model_dir = write_shape(args.shape, shape_dir)
        args.prompt_logprobs = None
        plain = time_to_first_token(model_dir, args)
        args.prompt_logprobs = args.k
        scored = time_to_first_token(model_dir, args, keep_outputs=args.reference)
        if args.reference:
            saved, logprobs.LOGPROBS_TRITON = logprobs.LOGPROBS_TRITON, False
            try:
                torch_run = time_to_first_token(model_dir, args, keep_outputs=True)
            finally:
                logprobs.LOGPROBS_TRITON = saved
            reference = {
                "ttft_prompt_logprobs_reference_s": torch_run["ttft_all_s"],
                "code_over_reference": round(scored["ttft_all_s"] / torch_run["ttft_all_s"], 3),
                "reference_problems": compare_outputs(torch_run["outputs"], scored["outputs"])}
    emit_summary({
        "benchmark": "prompt_logprobs", "shape": args.shape,
        "device": device_name(torch.device(args.device)), "dtype": args.dtype,
        "prompts": args.ttft_prompts, "prompt_len": args.ttft_len, "k": args.k,
        "ttft_plain_s": plain["ttft_all_s"], "ttft_prompt_logprobs_s": scored["ttft_all_s"],
        "ratio": round(scored["ttft_all_s"] / plain["ttft_all_s"], 3), **reference,
        "date": time.strftime("%Y-%m-%d"),
    }, args.out)
    if reference.get("reference_problems"):
        sys.exit(1)


LOGPROB_ATOL = 1e-3


def compare_outputs(want: list, got: list) -> list[str]:
    """What differs between two runs' deltas (prompt order): first tokens,
    and the prompt positions' entries (their logprobs, within LOGPROB_ATOL)."""
    problems = []
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        if a.new_token_ids != b.new_token_ids:
            problems.append(f"prompt {i}: first token {a.new_token_ids} != {b.new_token_ids}")
        for pos, (x, y) in enumerate(zip(a.prompt_logprobs or [], b.prompt_logprobs or [],
                                         strict=True)):
            if x is None or y is None:
                if x is not y:
                    problems.append(f"prompt {i} position {pos}: one side has no entry")
                continue
            values_x = sorted(e.logprob for e in x.values())
            values_y = sorted(e.logprob for e in y.values())
            if len(values_x) != len(values_y) or any(
                    abs(u - v) > LOGPROB_ATOL for u, v in zip(values_x, values_y)):
                problems.append(f"prompt {i} position {pos}: {x} != {y}")
    return problems[:20]


if __name__ == "__main__":
    main()
