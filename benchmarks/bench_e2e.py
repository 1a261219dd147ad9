"""End-to-end throughput and inter-token latency against HF transformers; prefill TTFT.

    python -m benchmarks.bench_e2e --shape 8b --num-requests 256 --input-len 512 --output-len 256
    python -m benchmarks.bench_e2e --shape tiny --device cpu --dtype float32 ...   (smoke test)

Both run on the same GPU in the same process, HF first (then freed): HF
``generate`` (eager, dynamic cache, greedy) over the same random prompts in
batches of ``--hf-batch``; tprun through the in-process engine (TP=1, CUDA
graphs, async scheduling) on all requests at once, and again with only
``--hf-batch`` requests so the two can be compared at the same batch size.
HF also runs one request alone (its batch-1 step time, for comparison with
other measurements of HF on this GPU). Weights are random bf16 of the real
shape. Prints a JSON summary last.

HF's eager ``generate`` launches every kernel from Python: when its step takes
the same time at batch 1 and at ``--hf-batch`` (within 20%), the host's
dispatch sets its pace, not the GPU work, and the summary says so
(``hf_host_bound`` with the two step times): the throughput ratio then
measures this host's Python speed more than tprun.

Time to first token: ``--ttft-prompts`` prompts of ``--ttft-len`` tokens
(``max_tokens=1``) through ``LLM``'s engine, from adding them all to the last
first token, beside the prefill FLOP floor: the FLOPs the prefill must do
(projections for every token, the LM head for each prompt's last token,
causal attention; benchmarks/floor.py) over the matmul throughput of a large
``torch.matmul`` timed in the same run. ``--attention-backend`` picks tprun's
attention backend for this part (e.g. triton_flash_prefill); ``--ttft-only``
runs this part alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time

import torch

from benchmarks import floor
from benchmarks.common import device_name, emit_summary, synchronize, timed_generation
from benchmarks.shapes import SHAPES, hf_config, shape_config, write_shape


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Token ids in [1000, 100000) (away from special tokens), within ``vocab``."""
    g = torch.Generator().manual_seed(seed)
    low, high = min(1000, vocab // 2), min(100000, vocab)
    return torch.randint(low, high, (n, length), generator=g).tolist()


def run_hf(shape: str, prompts: list[list[int]], output_len: int, batch: int,
           device: torch.device, dtype: torch.dtype) -> dict:
    import transformers

    config = hf_config(shape)
    with torch.device(device):
        model = transformers.LlamaForCausalLM._from_config(
            config, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    sync = lambda: synchronize(device)  # noqa: E731
    step_times, total_tokens, elapsed = [], 0, 0.0
    for i in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[i: i + batch], device=device)
        with torch.no_grad():
            sync()
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False,
                           pad_token_id=0)
            sync()
            t1 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len,
                                 do_sample=False, pad_token_id=0)
            sync()
            t2 = time.perf_counter()
        total_tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
        step_times.append(((t2 - t1) - (t1 - t0)) / (output_len - 1))
        elapsed += t2 - t1  # the one-token probe (prefill time) is not counted
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"batch": batch, "requests": len(prompts), "attn_implementation": "sdpa",
            "output_tokens": total_tokens,
            "elapsed_s": round(elapsed, 3), "output_tokens_per_s": round(total_tokens / elapsed, 1),
            "decode_step_ms": round(statistics.median(step_times) * 1e3, 3)}


def run_tprun(model_dir: str, prompts: list[list[int]], output_len: int, max_num_seqs: int,
              async_scheduling: bool, args) -> dict:
    from engine import LLM

    llm = LLM(model=model_dir, load_format="dummy", device=args.device, dtype=args.dtype,
              max_num_seqs=max_num_seqs, max_num_batched_tokens=8192,
              max_model_len=len(prompts[0]) + output_len + 16, async_scheduling=async_scheduling,
              enable_prefix_caching=False)
    try:
        timing = timed_generation(llm.engine, prompts, output_len, warmup_count=max_num_seqs)
    finally:
        llm.shutdown()
    return {"requests": len(prompts), "max_num_seqs": max_num_seqs,
            "async_scheduling": async_scheduling, **timing}


HOST_BOUND_TOLERANCE = 0.2


def hf_host_bound(hf: dict, hf_batch1: dict) -> dict:
    """Whether HF's decode step is as long at batch 1 as at its full batch."""
    big, one = hf["decode_step_ms"], hf_batch1["decode_step_ms"]
    ratio = big / one
    bound = abs(ratio - 1) <= HOST_BOUND_TOLERANCE
    pace = ("equal within 20%: the host's Python dispatch sets HF's pace, not the GPU work"
            if bound else "the step grows with the batch: the device sets HF's pace")
    return {"hf_host_bound": bound,
            "hf_host_bound_reason": f"HF decode step {big:.1f} ms at batch {hf['batch']}, "
                                    f"{one:.1f} ms at batch 1 (x{ratio:.2f}): {pace}"}


def time_to_first_token(model_dir: str, args, keep_outputs: bool = False,
                        **llm_options) -> dict:
    """All ``--ttft-prompts`` prompts added at once with max_tokens=1 (after an
    identical warm-up round); seconds until the last one has its token.
    ``llm_options`` go to ``LLM`` (bench_tp passes its TP size and executor);
    ``args.prompt_logprobs``, where set, asks every prompt for them
    (bench_prompt_logprobs). With ``keep_outputs`` the result also holds
    ``outputs``: the last round's deltas, in prompt order (not JSON)."""
    from engine import LLM, SamplingParams

    with open(os.path.join(model_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts = random_prompts(args.ttft_prompts, args.ttft_len, vocab, seed=1)
    llm = LLM(model=model_dir, load_format="dummy", device=args.device, dtype=args.dtype,
              max_num_seqs=args.ttft_prompts, max_num_batched_tokens=args.ttft_batched_tokens,
              max_model_len=args.ttft_len + 16, enable_prefix_caching=False,
              attention_backend=args.attention_backend, **llm_options)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                            prompt_logprobs=getattr(args, "prompt_logprobs", None))
    rounds = []
    try:
        for _ in range(1 + args.ttft_rounds):  # the first round warms up
            start = time.perf_counter()
            requests = [llm.engine.add_request({"prompt_token_ids": p}, params) for p in prompts]
            deltas = []
            while llm.engine.has_unfinished_requests():
                deltas += llm.engine.step()
            rounds.append(time.perf_counter() - start)
    finally:
        llm.shutdown()
    result = {"prompts": args.ttft_prompts, "prompt_len": args.ttft_len,
              "max_num_batched_tokens": args.ttft_batched_tokens,
              "attention_backend": args.attention_backend or "default",
              "ttft_all_s": round(statistics.median(rounds[1:]), 4),
              "rounds_s": [round(r, 4) for r in rounds[1:]]}
    if keep_outputs:
        order = {r.req_id: i for i, r in enumerate(requests)}
        result["outputs"] = sorted((d for d in deltas if d.req_id in order),
                                   key=lambda d: order[d.req_id])
    return result


def prefill_floor(shape: str, ttft: dict, device: torch.device, matmul_n: int,
                  sustain_s: float) -> dict:
    """The TTFT's FLOP floor, with the matmul throughput measured now in a
    burst; beside it, where ``sustain_s`` > 0, the same FLOPs at the rate the
    matmul holds over ``sustain_s`` seconds (``floor.matmul_tflops``), which
    is what a prefill that long can draw on under the device's power limit."""
    tflops, sustained = floor.matmul_tflops(device, matmul_n, sustain_s=sustain_s)
    flops = floor.prefill_flops(shape_config(shape), ttft["prompts"], ttft["prompt_len"])
    floor_s = floor.prefill_flop_floor_s(flops, tflops)
    result = {"matmul_tflops": float(f"{tflops:.4g}"), "matmul_n": matmul_n,
              "prefill_flops": flops, "prefill_floor_s": float(f"{floor_s:.4g}"),
              "ttft_ratio_to_floor": round(ttft["ttft_all_s"] / floor_s, 3)}
    if sustained is not None:
        sustained_s = floor.prefill_flop_floor_s(flops, sustained)
        result.update(matmul_sustain_s=sustain_s,
                      matmul_tflops_sustained=float(f"{sustained:.4g}"),
                      ttft_ratio_to_sustained_rate=round(ttft["ttft_all_s"] / sustained_s, 3))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--hf-batch", type=int, default=32)
    parser.add_argument("--hf-requests", type=int, default=32,
                        help="requests HF runs (in batches of --hf-batch)")
    parser.add_argument("--ttft-prompts", type=int, default=32)
    parser.add_argument("--ttft-len", type=int, default=2048)
    parser.add_argument("--ttft-rounds", type=int, default=3)
    parser.add_argument("--ttft-batched-tokens", type=int, default=8192,
                        help="max_num_batched_tokens of the TTFT run")
    parser.add_argument("--attention-backend", default=None,
                        help="tprun's attention backend for the TTFT run (default: the device's)")
    parser.add_argument("--matmul-n", type=int, default=8192,
                        help="size of the square matmul that measures TFLOP/s")
    parser.add_argument("--matmul-sustain-s", type=float, default=2.0,
                        help="seconds of back-to-back matmuls before, and in, the sustained "
                             "rate's timing (longer than the TTFT run's prefill; 0: none)")
    parser.add_argument("--ttft-only", action="store_true",
                        help="only the time to first token and its floor (no HF, no decode runs)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tprun-shape-") as shape_dir:
        summary = run_benchmark(args, write_shape(args.shape, shape_dir))
    emit_summary(summary, args.out)


def run_benchmark(args, model_dir: str) -> dict:
    """HF, tprun at HF's batch and all at once, then the TTFT; the summary."""
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.ttft_only:
        ttft = time_to_first_token(model_dir, args)
        ttft.update(prefill_floor(args.shape, ttft, device, args.matmul_n,
                                  args.matmul_sustain_s))
        return {"benchmark": "e2e", "shape": args.shape, "device": device_name(device),
                "dtype": args.dtype, "ttft": ttft, "date": time.strftime("%Y-%m-%d")}
    prompts = random_prompts(args.num_requests, args.input_len,
                             shape_config(args.shape)["vocab_size"])
    hf = run_hf(args.shape, prompts[: args.hf_requests], args.output_len, args.hf_batch,
                device, dtype)
    print(json.dumps({"hf": hf}), flush=True)
    hf_batch1 = run_hf(args.shape, prompts[:1], args.output_len, 1, device, dtype)
    print(json.dumps({"hf_batch1": hf_batch1}), flush=True)
    ours_batch = run_tprun(model_dir, prompts[: args.hf_batch], args.output_len,
                           args.hf_batch, True, args)
    print(json.dumps({"tprun_same_batch": ours_batch}), flush=True)
    ours_all = run_tprun(model_dir, prompts, args.output_len, args.num_requests, True, args)
    print(json.dumps({"tprun_all": ours_all}), flush=True)
    ttft = time_to_first_token(model_dir, args)
    ttft.update(prefill_floor(args.shape, ttft, device, args.matmul_n,
                              args.matmul_sustain_s))
    print(json.dumps({"ttft": ttft}), flush=True)
    summary = {
        "benchmark": "e2e", "shape": args.shape, "device": device_name(device),
        "dtype": args.dtype, "input_len": args.input_len, "output_len": args.output_len,
        "hf": hf, "hf_batch1": hf_batch1, **hf_host_bound(hf, hf_batch1),
        "tprun_same_batch": ours_batch, "tprun_all": ours_all,
        "throughput_ratio_same_batch": round(
            ours_batch["output_tokens_per_s"] / hf["output_tokens_per_s"], 2),
        "ttft": ttft, "date": time.strftime("%Y-%m-%d"),
    }
    return summary


if __name__ == "__main__":
    main()
