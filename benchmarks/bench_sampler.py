"""The sampler alone: what its launches after a decode step cost, per sampling configuration.

    python -m benchmarks.bench_sampler --batches 1 8 64 \\
        --variants default filters-2048x8 filters-16384x16
    python -m benchmarks.bench_sampler --device cpu --vocab 600 --batches 1 3 --iters 2 \\
        --kernels-on-cpu --variants default filters-2048x8   (smoke test: interpreter)

Each (configuration, batch) row builds a ``Sampler`` of ``batch`` slots over
``--vocab`` tokens and adds one seeded request a slot with the
configuration's parameters (``CONFIGS``; prompt and earlier output tokens
drawn at random, so the penalties have rows to read). It then times
``--iters`` back-to-back calls on the same logits, each one decode step's
sampling at the next position. The logits are in ``--dtype`` and shaped like
a language model's: ``3 * N(0, 1)`` with ``PEAK_TOKENS`` tokens a row lifted
by ``PEAK``, so top-p keeps tens of tokens, not thousands.

Each variant (``benchmarks/decode_variants.py``) runs on a fresh sampler with
the same requests and logits. Its tokens over every call must equal the
first variant's, and its logprobs must lie within ``LOGPROB_ATOL`` of them.
A row that differs is named in the summary's ``problems`` and the exit code
is 1. Times are CUDA events around the calls (device time, host-bound gaps
included), per call, in microseconds. The step-level A/B is
``bench_decode --variants``; this one isolates the sampler. Prints a JSON
summary last.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

from benchmarks import decode_variants
from benchmarks.common import device_name, emit_summary, init_device, time_per_call
from ipc.messages import SamplingOptions
from runner.ops import triton_ops
from runner.sampler import Sampler, SamplerOutput
from runner.staged_write_group import StagedWriteGroup

CONFIGS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.7),
    "top-p": dict(temperature=0.7, top_p=0.9),
    "top-k-top-p": dict(temperature=0.7, top_k=50, top_p=0.9),
    "penalties": dict(temperature=0.7, top_p=0.9, repetition_penalty=1.1,
                      frequency_penalty=0.2),
    "logprobs": dict(temperature=0.7, top_p=0.9, logprobs=5),
}
PEAK_TOKENS = 20
PEAK = 12.0
PROMPT_LEN = 200  # prompt tokens a request, then as many earlier outputs
LOGPROB_ATOL = 1e-3
WARMUP = 3


def make_logits(batch: int, vocab: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(batch)
    logits = 3 * torch.randn(batch, vocab, generator=gen)
    peaks = torch.randint(0, vocab, (batch, PEAK_TOKENS), generator=gen)
    logits.scatter_add_(1, peaks, torch.full(peaks.shape, PEAK))
    return logits.to(dtype).to(device)


def build_sampler(config: dict, batch: int, vocab: int, device: torch.device,
                  kernels_on_cpu: bool) -> Sampler:
    """A sampler with one request of ``config`` a slot, seeded by its slot."""
    sampler = Sampler(batch, vocab, device, seed=0)
    if kernels_on_cpu:
        sampler.ops = sampler.penalties.ops = triton_ops(device)
    gen = torch.Generator().manual_seed(vocab)
    tokens = torch.randint(0, vocab, (batch, 2 * PROMPT_LEN), generator=gen, dtype=torch.int32)
    for slot in range(batch):
        sampler.add_request(slot, SamplingOptions(**config, seed=slot), PROMPT_LEN,
                            2 * PROMPT_LEN)
    StagedWriteGroup(sampler.staged_tensors).apply_writes()
    sampler.write_added_rows(tokens.to(device))
    return sampler


def time_variant(config: dict, batch: int, logits: torch.Tensor, iters: int,
                 kernels_on_cpu: bool) -> tuple[float, list[SamplerOutput]]:
    """Seconds per sampler call and the outputs of every call (warm-up first)."""
    device = logits.device
    sampler = build_sampler(config, batch, logits.shape[1], device, kernels_on_cpu)
    idx_np = np.arange(batch, dtype=np.int32)
    idx = torch.from_numpy(idx_np).to(device)
    mask = torch.ones(batch, dtype=torch.bool, device=device)
    positions = (2 * PROMPT_LEN + torch.arange(WARMUP + iters)[:, None]
                 + torch.zeros(batch, dtype=torch.int64)).to(device)
    outputs: list[SamplerOutput] = []

    def call() -> None:
        outputs.append(sampler(logits, idx, idx_np, positions[len(outputs)], mask))

    seconds = time_per_call(call, device, iters=iters, warmup=WARMUP)
    return seconds, outputs


def differences(want: list[SamplerOutput], got: list[SamplerOutput]) -> str | None:
    """How ``got`` differs from ``want`` (tokens, then logprobs), or None."""
    for step, (a, b) in enumerate(zip(want, got, strict=True)):
        if not torch.equal(a.sampled_token_ids.cpu(), b.sampled_token_ids.cpu()):
            return f"call {step}: tokens differ"
        if (a.logprobs is None) != (b.logprobs is None):
            return f"call {step}: logprobs on one side only"
        if a.logprobs is not None and not torch.allclose(
                a.logprobs.sampled_logprobs.cpu(), b.logprobs.sampled_logprobs.cpu(),
                atol=LOGPROB_ATOL, rtol=0):
            return f"call {step}: logprobs differ"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--variants", nargs="+", choices=sorted(decode_variants.VARIANTS),
                        default=["default"])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--kernels-on-cpu", action="store_true",
                        help="on CPU, the Triton kernels under the interpreter (a smoke test)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.kernels_on_cpu and args.device != "cpu":
        parser.error("--kernels-on-cpu is for --device cpu")
    if args.kernels_on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is first imported
    device = init_device(args.device)
    dtype = getattr(torch, args.dtype)
    rows, problems = [], []
    for name in args.configs:
        for batch in args.batches:
            logits = make_logits(batch, args.vocab, dtype, device)
            timed = {}
            for variant in args.variants:
                with decode_variants.applied(variant):
                    timed[variant] = time_variant(CONFIGS[name], batch, logits, args.iters,
                                                  args.kernels_on_cpu)
            first_s, first_out = timed[args.variants[0]]
            row = {"config": name, "batch": batch, "variants": {}}
            for variant, (seconds, outputs) in timed.items():
                problem = differences(first_out, outputs)
                row["variants"][variant] = {"us_per_call": round(seconds * 1e6, 2),
                                            "over_first": round(seconds / first_s, 4),
                                            "outputs_equal": problem is None}
                if problem:
                    problems.append(f"{name} batch {batch} {variant}: {problem}")
            print(row, flush=True)
            rows.append(row)
    emit_summary({
        "benchmark": "sampler", "device": device_name(device), "dtype": args.dtype,
        "vocab": args.vocab, "iters": args.iters, "torch": torch.__version__,
        "configs": {name: CONFIGS[name] for name in args.configs},
        "variants": {name: decode_variants.VARIANTS[name].description for name in args.variants},
        "date": time.strftime("%Y-%m-%d"), "rows": rows, "problems": problems,
    }, args.out)
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
