"""``tprun``: torchrun's flags, then a subcommand that does the work.

    tprun --nproc-per-node 2 generate --model tiny --prompt "Hello" --json

The tprun process is the executor process (engine + executor); it starts
one worker daemon per rank with the environment torchrun would set.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

DEFAULT_PROMPTS = ["Hello, my name is", "The future of AI is"]


def _engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="'tiny' or a HF model directory")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto",
                        choices=("auto", "float32", "float16", "bfloat16"))
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tprun", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                        help="tensor-parallel ranks (worker daemons) on this host")
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
    parser.add_argument("--master-port", "--master_port", type=int, default=None)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for prompts")
    _engine_args(gen)
    gen.add_argument("--prompt", action="append", default=[], help="a text prompt (repeatable)")
    gen.add_argument("--prompt-token-ids", action="append", default=[],
                     help="a prompt as comma-separated token ids (repeatable)")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--sampling-seed", type=int, default=None,
                     help="per-request sampling seed (default: from --seed)")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt and line")
    return parser


def _prompts(args) -> list:
    prompts: list = list(args.prompt)
    for text in args.prompt_token_ids:
        try:
            prompts.append({"prompt_token_ids": [int(t) for t in text.split(",") if t.strip()]})
        except ValueError as e:
            raise SystemExit(f"--prompt-token-ids must be comma-separated integers: {e}") from e
    return prompts or list(DEFAULT_PROMPTS)


def run_generate(args) -> int:
    from engine import LLM, SamplingParams

    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            seed=args.sampling_seed, ignore_eos=args.ignore_eos)
    prompts = _prompts(args)
    with LLM(model=args.model, tensor_parallel_size=args.nproc_per_node, device=args.device,
             dtype=args.dtype, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
             max_num_batched_tokens=args.max_num_batched_tokens,
             max_model_len=args.max_model_len, enforce_eager=args.enforce_eager,
             num_gpu_blocks_override=args.num_gpu_blocks_override, seed=args.seed,
             executor="mp", master_addr=args.master_addr, master_port=args.master_port) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=len(prompts) > 1 and not args.json)
    for i, out in enumerate(outputs):
        completion = out.outputs[0]
        if args.json:
            print(json.dumps({"index": i, "prompt_token_ids": out.prompt_token_ids,
                              "token_ids": completion.token_ids, "text": completion.text,
                              "finish_reason": completion.finish_reason}), flush=True)
        else:
            shown = out.prompt if out.prompt is not None else out.prompt_token_ids
            print(f"[{i}] {shown!r} -> {completion.text!r} ({completion.finish_reason})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("TPRUN_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from executor.base import WorkerFailure

    try:
        if args.command == "generate":
            return run_generate(args)
    except (ValueError, WorkerFailure, TimeoutError) as e:
        print(f"tprun: error: {e}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
