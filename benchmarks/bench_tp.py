"""Tensor parallelism: TP=N against TP=1 on the same weights, and its speed.

    python -m benchmarks.bench_tp --shape 8b --tp 1 2 4 8            (GPUs, NCCL)
    python -m benchmarks.bench_tp --shape tiny --device cpu --tp 1 2  (CPU, gloo)

For each N, ``LLM(tensor_parallel_size=N, executor="mp", load_format="dummy")``
starts the worker daemons as ``tprun --nproc-per-node N`` would: TP=1 too runs
in a worker daemon, so every size pays the same broadcast and reply. Random weights are drawn
whole per tensor from a seed and sliced per rank (runner/loader.py), so every
N runs the same model. Two runs per N:

- agreement: greedy decoding of fixed prompts with the sampled token's
  logprob; against TP=1, the index of the first differing token of each
  prompt (None: none differ) and the largest logprob difference over the
  tokens before it. bf16 sums in another order, and random weights give
  nearly flat logits, so a near tie may flip even the first token: this
  row cannot tell a tie from a bug. tests/runner/test_tp_parity.py can
  (float32 logits within 1e-3 of TP=1's; bf16 error against a float32
  reference no larger than TP=1's own).
- speed: for each ``--batch`` B, B requests of ``--input-len`` random tokens
  decode ``--output-len`` tokens each: output tokens/s and inter-token
  latency, with async scheduling on and off (``speed[mode][B]``). Off,
  each step's inter-token latency is the device step plus the host's round
  trip (schedule, broadcast, reply, update); set beside ``bench_decode.py``'s
  step time under torchrun (the device step alone, all-reduces included) it
  gives the breakdown.

With ``--ttft-prompts`` P (default 32) each N also times the first token of
P prompts of ``--ttft-len`` tokens added at once (bench_e2e's
time_to_first_token, ``max_num_batched_tokens=--ttft-batched-tokens``): the
prefill alone, which the speed rows mix with decoding.

Prints one JSON line per N, then a JSON summary last.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

from benchmarks.bench_e2e import time_to_first_token
from benchmarks.common import emit_summary, timed_generation
from benchmarks.shapes import write_shape
from engine import LLM, SamplingParams
from engine.config import EngineConfig


def model_dir_for(shape: str, directory: str) -> str:
    if shape == "tiny":
        from checkpoint.tiny_model import ensure_tiny_model

        return ensure_tiny_model(directory)
    return write_shape(shape, directory)


def agreement_prompts(vocab: int, count: int = 8, length: int = 24) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(count)]


def greedy_with_logprobs(llm: LLM, prompts: list[list[int]], max_tokens: int):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    result = []
    for out in outs:
        completion = out.outputs[0]
        lps = [entry[token].logprob for token, entry in zip(completion.token_ids,
                                                            completion.logprobs)]
        result.append((completion.token_ids, lps))
    return result


def compare(reference, other) -> dict:
    """First differing token per prompt and the largest logprob gap before it."""
    first_diff, max_gap = [], 0.0
    for (ref_tokens, ref_lps), (tokens, lps) in zip(reference, other, strict=True):
        diff = next((i for i, (a, b) in enumerate(zip(ref_tokens, tokens)) if a != b), None)
        first_diff.append(diff)
        upto = len(ref_tokens) if diff is None else diff
        gaps = [abs(a - b) for a, b in zip(ref_lps[:upto], lps[:upto])]
        max_gap = max([max_gap, *gaps])
    return {"first_differing_token": first_diff, "max_logprob_gap": float(f"{max_gap:.3g}")}


def decode_speed(llm: LLM, vocab: int, batch: int, input_len: int, output_len: int) -> dict:
    rng = random.Random(3)
    prompts = [[rng.randrange(3, vocab) for _ in range(input_len)] for _ in range(batch)]
    return {"batch": batch, **timed_generation(llm.engine, prompts, output_len, batch)}


def make_llm(model_dir: str, tp: int, args, max_num_seqs: int, async_scheduling: bool) -> LLM:
    return LLM(model=model_dir, tensor_parallel_size=tp, device=args.device, dtype=args.dtype,
               executor="mp", load_format="dummy", max_num_seqs=max_num_seqs,
               max_model_len=args.input_len + args.output_len + 64, enable_prefix_caching=False,
               async_scheduling=async_scheduling, attention_backend=args.attention_backend,
               **({"max_num_batched_tokens": args.max_num_batched_tokens}
                  if args.max_num_batched_tokens else {}))


def run_tp(model_dir: str, tp: int, args, prompts) -> tuple[list, dict]:
    """Greedy agreement run (in the first LLM) and speed for each of
    ``--scheduling`` (async scheduling on, off)."""
    speed, greedy = {}, None
    for async_scheduling in (mode == "async" for mode in args.scheduling):
        llm = make_llm(model_dir, tp, args, max(*args.batch, len(prompts)), async_scheduling)
        try:
            vocab = llm.engine.model_config.vocab_size
            if greedy is None:
                greedy = greedy_with_logprobs(llm, prompts, args.agree_tokens)
            key = "async" if async_scheduling else "sync"
            speed[key] = {str(batch): decode_speed(llm, vocab, batch, args.input_len,
                                                   args.output_len)
                          for batch in args.batch}
        finally:
            llm.shutdown()
    return greedy, speed


def run_sizes(args, model_dir: str) -> list[dict]:
    """One row per TP size, each compared with the first (TP=1)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        prompts = agreement_prompts(json.load(f)["vocab_size"])
    results, reference = [], None
    for tp in args.tp:
        greedy, speed = run_tp(model_dir, tp, args, prompts)
        reference = reference or greedy
        row = {"tp": tp, **compare(reference, greedy), "speed": speed}
        if args.ttft_prompts:
            row["ttft"] = time_to_first_token(model_dir, args, tensor_parallel_size=tp,
                                              executor="mp")
        results.append(row)
        print(json.dumps(row), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8b", choices=("tiny", "1b", "8b"))
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--agree-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="the engine's token budget per step in the speed runs "
                             "(default: the engine's)")
    parser.add_argument("--scheduling", nargs="+", choices=("async", "sync"),
                        default=["async", "sync"], help="speed runs with async scheduling on, off")
    parser.add_argument("--ttft-prompts", type=int, default=32,
                        help="prompts of the time-to-first-token run (0: none)")
    parser.add_argument("--ttft-len", type=int, default=2048)
    parser.add_argument("--ttft-rounds", type=int, default=2)
    parser.add_argument("--ttft-batched-tokens", type=int, default=8192,
                        help="max_num_batched_tokens of the time-to-first-token run")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.tp[0] != 1:
        parser.error("the first --tp must be 1: the others are compared with it")

    with tempfile.TemporaryDirectory(prefix="tprun-shape-") as directory:
        results = run_sizes(args, model_dir_for(args.shape, directory))
    budget = EngineConfig(device=args.device,
                          max_num_batched_tokens=args.max_num_batched_tokens)
    emit_summary({"benchmark": "tp", "shape": args.shape, "device": args.device,
                  "dtype": args.dtype, "date": time.strftime("%Y-%m-%d"),
                  "max_num_batched_tokens": budget.resolved_max_num_batched_tokens,
                  "results": results},
                 args.out)


if __name__ == "__main__":
    main()
