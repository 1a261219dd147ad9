"""``tprun bench``: throughput and latency of one engine, measured in process.

The benchmark drives ``LLMEngine`` directly in the tprun process (at TP > 1
the engine still drives its worker daemons over IPC, as ``generate`` does;
no client socket is involved). Every request is submitted at time 0 (an
offline batch, as vLLM's throughput benchmark), with ``ignore_eos`` so each
produces exactly its ``max_tokens``. Each step's deltas are timestamped as
the engine returns them:

- TTFT: first-token time minus submit time (queueing included);
- ITL: the gap between a request's successive deltas, shared equally by
  the tokens of the later delta;
- throughput: requests, output tokens and prompt + output tokens per
  second of wall time from the first submit to the last finish.

A short warm-up request runs first and is not counted.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import numpy as np

from engine.llm_engine import LLMEngine
from engine.progress import RequestProgress
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.stats import spec_decode_summary


@dataclass(frozen=True)
class BenchConfig:
    """``dataset``: a JSONL file, one object per line with "prompt" (text) or
    "prompt_token_ids", and optionally "max_tokens" (else ``output_len``).
    Without it, ``num_prompts`` prompts of ``input_len`` random token ids
    (drawn from ``seed``).

    The dataset is read here, once, when the config is made
    (``dataset_requests``, kept in ``from_dataset``): a bad line is a
    ``ValueError`` before any model loads, and ``run_bench`` runs what was
    read, never the file again."""

    num_prompts: int = 64
    input_len: int = 128
    output_len: int = 64
    dataset: str | None = None
    seed: int = 0
    temperature: float = 0.0
    warmup: bool = True
    from_dataset: tuple[BenchRequest, ...] | None = field(default=None, init=False, repr=False,
                                                          compare=False)

    def __post_init__(self) -> None:
        for name in ("num_prompts", "input_len", "output_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.dataset is not None:
            if not os.path.isfile(self.dataset):
                raise ValueError(f"dataset {self.dataset!r} is not a file")
            requests = tuple(dataset_requests(self.dataset, self.output_len))
            object.__setattr__(self, "from_dataset", requests)


@dataclass(frozen=True)
class BenchRequest:
    prompt: dict
    max_tokens: int


def random_requests(config: BenchConfig, vocab_size: int) -> list[BenchRequest]:
    rng = np.random.default_rng(config.seed)
    ids = rng.integers(0, vocab_size, size=(config.num_prompts, config.input_len))
    return [BenchRequest({"prompt_token_ids": row.tolist()}, config.output_len) for row in ids]


def dataset_requests(path: str, output_len: int) -> list[BenchRequest]:
    """Read a JSONL dataset; ``ValueError`` names the first bad line."""
    requests = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                requests.append(_dataset_request(json.loads(line), output_len))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{number}: {e}") from None
    if not requests:
        raise ValueError(f"{path} holds no prompts")
    return requests


def _dataset_request(obj, output_len: int) -> BenchRequest:
    if not isinstance(obj, dict):
        raise ValueError("each line must be a JSON object")
    keys = {"prompt", "prompt_token_ids"} & set(obj)
    if len(keys) != 1:
        raise ValueError('give exactly one of "prompt" and "prompt_token_ids"')
    key = keys.pop()
    max_tokens = obj.get("max_tokens", output_len)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    return BenchRequest({key: obj[key]}, max_tokens)


@dataclass
class _Timing:
    """When one request was submitted and when each of its deltas arrived."""

    start: float
    num_prompt_tokens: int
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens)


def _make(engine: LLMEngine, requests: list[BenchRequest], temperature: float,
          seed: int, id_prefix: str) -> list[Request]:
    """Every request, tokenized and checked before any is queued."""
    made = []
    for i, r in enumerate(requests):
        params = SamplingParams(temperature=temperature, max_tokens=r.max_tokens,
                                ignore_eos=True, seed=seed + i if temperature > 0 else None)
        made.append(engine.new_request(r.prompt, params, req_id=f"{id_prefix}{i}"))
    return made


def _submit(engine: LLMEngine, requests: list[Request]) -> dict[str, _Timing]:
    timings = {}
    for request in requests:
        engine.enqueue(request)
        timings[request.req_id] = _Timing(time.perf_counter(), request.num_prompt_tokens)
    return timings


def run_requests(engine: LLMEngine, requests: list[BenchRequest], temperature: float = 0.0,
                 seed: int = 0, progress: bool = True,
                 id_prefix: str = "bench-") -> tuple[dict[str, _Timing], float, float]:
    """Submit all, step the engine until they finish; returns the timings,
    the wall time and the highest KV usage seen."""
    made = _make(engine, requests, temperature, seed, id_prefix)
    start = time.perf_counter()
    timings = _submit(engine, made)
    max_kv_usage = 0.0
    with RequestProgress(len(requests), "bench", progress) as bar:
        while engine.has_unfinished_requests():
            deltas = engine.step()
            now = time.perf_counter()
            max_kv_usage = max(max_kv_usage, engine.scheduler.kv.usage)
            for d in deltas:
                if d.new_token_ids:
                    timings[d.req_id].arrivals.append((now, len(d.new_token_ids)))
            bar.advance(sum(d.finished for d in deltas),
                        sum(len(d.new_token_ids) for d in deltas))
    return timings, time.perf_counter() - start, max_kv_usage


def percentiles(values_s: list[float]) -> dict[str, float]:
    """Mean, p50, p90 and p99 in milliseconds (zeros when empty)."""
    if not values_s:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    ms = np.asarray(values_s) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"mean": float(ms.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def latencies(timings: dict[str, _Timing]) -> tuple[list[float], list[float]]:
    """TTFT per request, and ITL per output token after the first, in seconds."""
    ttft, itl = [], []
    for t in timings.values():
        if not t.arrivals:
            continue
        ttft.append(t.arrivals[0][0] - t.start)
        for (before, _), (after, n) in zip(t.arrivals, t.arrivals[1:]):
            itl += [(after - before) / n] * n
    return ttft, itl


def run_bench(engine: LLMEngine, config: BenchConfig, progress: bool = True) -> dict:
    """Run the benchmark on ``engine``: the dataset's requests (read when
    ``config`` was made), else random ones; returns the summary (see
    ``summarize``)."""
    if config.from_dataset is not None:
        requests = list(config.from_dataset)
    else:
        requests = random_requests(config, engine.model_config.vocab_size)
    if config.warmup:
        warm = BenchRequest(dict(requests[0].prompt), min(4, requests[0].max_tokens))
        run_requests(engine, [warm], progress=False, id_prefix="warmup-")
    before = engine.get_stats()
    timings, duration, max_kv = run_requests(engine, requests, config.temperature,
                                             config.seed, progress)
    after = engine.get_stats()
    return summarize(engine, timings, duration, max_kv, before, after)


def summarize(engine: LLMEngine, timings: dict[str, _Timing], duration: float,
              max_kv_usage: float, before, after) -> dict:
    """The summary: throughput, latency percentiles, engine counters."""
    ttft, itl = latencies(timings)
    input_tokens = sum(t.num_prompt_tokens for t in timings.values())
    output_tokens = sum(n for t in timings.values() for _, n in t.arrivals)
    duration = max(duration, 1e-9)
    return {
        "num_requests": len(timings),
        "duration_s": duration,
        "requests_per_s": len(timings) / duration,
        "output_tokens_per_s": output_tokens / duration,
        "total_tokens_per_s": (input_tokens + output_tokens) / duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "ttft_ms": percentiles(ttft),
        "itl_ms": percentiles(itl),
        "engine": {
            "tensor_parallel_size": engine.config.tensor_parallel_size,
            "async_scheduling": engine.config.async_scheduling,
            "device": engine.device,
            "num_steps": after.num_steps - before.num_steps,
            "num_preemptions": after.num_preemptions - before.num_preemptions,
            "prefix_hit_rate": after.prefix_hit_rate,
            "max_kv_usage": max_kv_usage,
        },
        "spec_decode": spec_decode_summary(before, after),
    }


def format_summary(s: dict) -> str:
    """The summary as a short human-readable table."""
    e = s["engine"]
    lines = [
        f"requests: {s['num_requests']} in {s['duration_s']:.2f} s "
        f"(TP={e['tensor_parallel_size']}, async scheduling "
        f"{'on' if e['async_scheduling'] else 'off'}, {e['device']})",
        f"throughput: {s['requests_per_s']:.2f} req/s, "
        f"{s['output_tokens_per_s']:.1f} output tok/s, {s['total_tokens_per_s']:.1f} total tok/s",
    ]
    for name in ("ttft_ms", "itl_ms"):
        p = s[name]
        lines.append(f"{name[:-3].upper():>4} ms: mean {p['mean']:.2f}  p50 {p['p50']:.2f}  "
                     f"p90 {p['p90']:.2f}  p99 {p['p99']:.2f}")
    lines.append(f"engine: {e['num_steps']} steps, {e['num_preemptions']} preemptions, "
                 f"max KV usage {100 * e['max_kv_usage']:.1f}%, "
                 f"prefix hit rate {100 * e['prefix_hit_rate']:.1f}%")
    spec = s.get("spec_decode")
    if spec is not None:
        lines.append(f"spec decode: acceptance rate {100 * spec['acceptance_rate']:.1f}%, "
                     f"mean acceptance length {spec['mean_acceptance_length']:.2f}, "
                     f"{spec['num_accepted_tokens']}/{spec['num_draft_tokens']} drafts accepted")
    return "\n".join(lines)
