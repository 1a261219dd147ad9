"""Time of prepare_inputs: the step's host-to-device copy and input kernels.

    python -m benchmarks.bench_prepare_inputs [--device cuda] [--iters 200]

Two batches on the embedded tiny model (the model's size does not matter
here): a 256-request decode batch, and a mixed batch of 64 decodes plus four
256-token prefill chunks. Reports, in microseconds (median of ``--iters``),
the host time of ``make_input_batch`` + ``_prepare_inputs`` and the device time of
the same work (CUDA events). Prints a JSON summary last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from benchmarks.common import emit_summary
from checkpoint.description import describe
from checkpoint.tiny_model import ensure_tiny_model
from engine.config import EngineConfig
from ipc.messages import NewRequestData, SamplingOptions, SchedulerOutput
from runner.distributed import TensorParallelGroup
from runner.input_batch import make_input_batch
from runner.model_runner import ModelRunner


def _add_requests(runner: ModelRunner, prompts: dict[str, int], computed: dict[str, int]):
    new, block = [], 0
    for req_id, length in prompts.items():
        n = -(-(length + 8) // runner.config.block_size)
        new.append(NewRequestData(
            req_id=req_id, prompt_token_ids=[1] * length, prefill_token_ids=[1] * length,
            sampling=SamplingOptions(temperature=0.0), block_ids=[list(range(block, block + n))],
            num_computed_tokens=computed[req_id], max_tokens=8))
        block += n
    runner._update_states(SchedulerOutput(step_id=0, scheduled_new_reqs=new))
    runner._write_step(None)


def time_prepare(runner: ModelRunner, scheduled: dict[str, int], iters: int) -> dict:
    states = runner.req_states
    on_cuda = runner.device.type == "cuda"
    host, device = [], []
    for _ in range(iters + 10):
        if on_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        batch = make_input_batch(list(scheduled), list(scheduled.values()),
                                 states.req_id_to_index, states.num_computed_tokens_np,
                                 states.prefill_len_np)
        runner.buffers.copy_step_meta(batch.idx_mapping_np, batch.query_start_loc_np,
                                      states.pad_slot)
        runner._prepare_inputs(batch)
        host.append(time.perf_counter() - t0)
        if on_cuda:
            end.record()
            end.synchronize()
            device.append(start.elapsed_time(end) / 1e3)
    med = lambda xs: round(statistics.median(xs[10:]) * 1e6, 1) if xs else None  # noqa: E731
    return {"num_reqs": len(scheduled), "num_tokens": sum(scheduled.values()),
            "host_us": med(host), "device_us": med(device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    model_dir = ensure_tiny_model(os.environ.get("TPRUN_CACHE") or tempfile.mkdtemp())
    config = EngineConfig(model=model_dir, device=args.device, max_num_seqs=512,
                          max_num_batched_tokens=2048, max_model_len=1024,
                          enforce_eager=True).runner_config(model_dir, describe(model_dir))
    runner = ModelRunner(config, device, TensorParallelGroup.from_default_group())
    runner.init_kv_cache(40000)

    decode = {f"d{i}": 300 for i in range(256)}
    _add_requests(runner, decode, {r: 300 for r in decode})
    results = [dict(batch="decode-256", **time_prepare(runner, dict.fromkeys(decode, 1),
                                                        args.iters))]
    prefills = {f"p{i}": 700 for i in range(4)}
    _add_requests(runner, prefills, dict.fromkeys(prefills, 0))
    mixed = {**{f"d{i}": 1 for i in range(64)}, **dict.fromkeys(prefills, 256)}
    results.append(dict(batch="mixed-64d-4x256p", **time_prepare(runner, mixed, args.iters)))
    for row in results:
        print(json.dumps(row))
    emit_summary({"benchmark": "prepare_inputs", "device": str(device),
                  "date": time.strftime("%Y-%m-%d"), "results": results}, None)


if __name__ == "__main__":
    main()
