"""End-to-end throughput and inter-token latency against HF transformers.

    python benchmarks/bench_e2e.py --shape 8b --num-requests 256 --input-len 512 --output-len 256

Both run on the same GPU in the same process, HF first (then freed): HF
``generate`` (eager, dynamic cache, greedy) over the same random prompts in
batches of ``--hf-batch``; tprun through the in-process engine (TP=1, CUDA
graphs, async scheduling) on all requests at once, and again with only
``--hf-batch`` requests so the two can be compared at the same batch size.
HF also runs one request alone (its batch-1 step time, for comparison with
other measurements of HF on this GPU). Weights are random bf16 of the real
shape. Prints a JSON summary last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.engine_timing import timed_generation  # noqa: E402
from benchmarks.shapes import hf_config, write_shape  # noqa: E402
from benchmarks.summary import emit_summary  # noqa: E402


def random_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1000, 100000, (n, length), generator=g).tolist()


def run_hf(shape: str, prompts: list[list[int]], output_len: int, batch: int) -> dict:
    import transformers

    config = hf_config(shape)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM._from_config(
            config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    step_times, total_tokens, elapsed = [], 0, 0.0
    for i in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[i: i + batch], device="cuda")
        with torch.no_grad():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False,
                           pad_token_id=0)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len,
                                 do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
        total_tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
        step_times.append(((t2 - t1) - (t1 - t0)) / (output_len - 1))
        elapsed += t2 - t1  # the one-token probe (prefill time) is not counted
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {"batch": batch, "requests": len(prompts), "attn_implementation": "sdpa",
            "output_tokens": total_tokens,
            "elapsed_s": round(elapsed, 3), "output_tokens_per_s": round(total_tokens / elapsed, 1),
            "decode_step_ms": round(statistics.median(step_times) * 1e3, 3)}


def run_tprun(model_dir: str, prompts: list[list[int]], output_len: int, max_num_seqs: int,
              async_scheduling: bool) -> dict:
    from engine import LLM

    llm = LLM(model=model_dir, load_format="dummy", device="cuda", dtype="bfloat16",
              max_num_seqs=max_num_seqs, max_num_batched_tokens=8192,
              max_model_len=len(prompts[0]) + output_len + 16, async_scheduling=async_scheduling,
              enable_prefix_caching=False)
    try:
        timing = timed_generation(llm.engine, prompts, output_len, warmup_count=max_num_seqs)
    finally:
        llm.shutdown()
    return {"requests": len(prompts), "max_num_seqs": max_num_seqs,
            "async_scheduling": async_scheduling, **timing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8b", choices=("1b", "8b"))
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--hf-batch", type=int, default=32)
    parser.add_argument("--hf-requests", type=int, default=32,
                        help="requests HF runs (in batches of --hf-batch)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    prompts = random_prompts(args.num_requests, args.input_len)
    model_dir = write_shape(args.shape, tempfile.mkdtemp(prefix="tprun-shape-"))
    hf = run_hf(args.shape, prompts[: args.hf_requests], args.output_len, args.hf_batch)
    print(json.dumps({"hf": hf}), flush=True)
    hf_batch1 = run_hf(args.shape, prompts[:1], args.output_len, 1)
    print(json.dumps({"hf_batch1": hf_batch1}), flush=True)
    ours_batch = run_tprun(model_dir, prompts[: args.hf_batch], args.output_len,
                           args.hf_batch, async_scheduling=True)
    print(json.dumps({"tprun_same_batch": ours_batch}), flush=True)
    ours_all = run_tprun(model_dir, prompts, args.output_len, args.num_requests,
                         async_scheduling=True)
    print(json.dumps({"tprun_all": ours_all}), flush=True)
    summary = {
        "benchmark": "e2e", "shape": args.shape, "device": torch.cuda.get_device_name(),
        "input_len": args.input_len, "output_len": args.output_len, "hf": hf,
        "hf_batch1": hf_batch1,
        "tprun_same_batch": ours_batch, "tprun_all": ours_all,
        "throughput_ratio_same_batch": round(
            ours_batch["output_tokens_per_s"] / hf["output_tokens_per_s"], 2),
        "date": time.strftime("%Y-%m-%d"),
    }
    emit_summary(summary, args.out)


if __name__ == "__main__":
    main()
