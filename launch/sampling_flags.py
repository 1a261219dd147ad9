"""``tprun generate``'s sampling options: vLLM's ``SamplingParams`` fields
spelled as flags (``top_p`` is ``--top-p``; ``seed`` is ``--sampling-seed``,
since ``--seed`` is the engine's), and the one ``SamplingParams`` they make.

The options only translate: each takes the field's default (``--max-tokens``
32 and ``--temperature`` 0 are generate's own), and ``sampling_params``
hands every value to ``SamplingParams``, whose checks are the only ones. A
value it refuses becomes a ``ConfigError`` naming the option at fault, so
the launch ends with one ``tprun: error:`` line (exit code 2) before any
worker starts; the option is the field the error names (its ``param``,
else the first field its message names). ``--thinking-token-budget``
needs a reasoning parser, which only the engine's configuration tells:
``check_thinking_budget`` applies the engine's own rule to it
(``engine.thinking_budget.check_budget_has_parser``) before the engine
starts. So does ``check_logprobs`` with the engine's cap on ``--logprobs``
(``--max-logprobs``, ``engine.request.check_logprobs_limit``), for a
number; -1, the whole vocabulary, is judged by the engine, which knows the
vocabulary's size.
"""

from __future__ import annotations

import argparse
import re

# SamplingParams field -> (flag, argparse options). The dest of each flag is
# argparse's (the flag in snake case); the defaults are added from the fields.
_FLAGS: dict[str, tuple[str, dict]] = {
    "max_tokens": ("--max-tokens", dict(type=int, default=32,
                                        help="output tokens per completion at most")),
    "min_tokens": ("--min-tokens", dict(type=int, help="tokens to generate before a stop "
                                        "or end-of-sequence token may end the output")),
    "temperature": ("--temperature", dict(type=float, default=0.0,
                                          help="sampling temperature (0: greedy)")),
    "top_p": ("--top-p", dict(type=float, help="nucleus sampling: the smallest set of "
                              "tokens whose probability reaches this (1: off)")),
    "top_k": ("--top-k", dict(type=int, help="sample among the k most likely tokens "
                              "(0 or -1: off)")),
    "min_p": ("--min-p", dict(type=float, help="drop tokens less likely than this times "
                              "the most likely one's probability (0: off)")),
    "presence_penalty": ("--presence-penalty", dict(
        type=float, help="subtracted from the logit of each token the output holds (0: off)")),
    "frequency_penalty": ("--frequency-penalty", dict(
        type=float, help="subtracted from each token's logit once per time the output "
        "holds it (0: off)")),
    "repetition_penalty": ("--repetition-penalty", dict(
        type=float, help="divides the positive logits (multiplies the negative ones) of "
        "tokens in the prompt or the output (1: off)")),
    "seed": ("--sampling-seed", dict(type=int, help="per-request sampling seed (completion "
                                     "i of --n samples with seed + i; default: from --seed)")),
    "n": ("--n", dict(type=int, help="completions per prompt (above 1 needs a temperature "
                      "above 0)")),
    "stop": ("--stop", dict(action="append", metavar="TEXT", help="end the output before "
                            "this text (repeatable; none by default)")),
    "stop_token_ids": ("--stop-token-ids", dict(metavar="IDS", help="comma-separated token "
                                                "ids that end the output (none by default)")),
    "ignore_eos": ("--ignore-eos", dict(action="store_true", help="keep generating past "
                                        "end-of-sequence tokens (up to --max-tokens)")),
    "logprobs": ("--logprobs", dict(type=int, metavar="N", help="each output token's N most "
                                    "likely tokens and the sampled one, with their logprobs "
                                    "(in --json; plain output: their sum); at most "
                                    "--max-logprobs; -1: the whole vocabulary, which needs "
                                    "--max-logprobs -1 (or one it fits in)")),
    "thinking_token_budget": ("--thinking-token-budget", dict(
        type=int, metavar="N", help="at most N tokens of reasoning, then its end is forced "
        "(needs --reasoning-parser)")),
}


def _dest(field: str) -> str:
    return _FLAGS[field][0][2:].replace("-", "_")


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """One option per ``_FLAGS`` entry, with the field's default unless the
    entry names its own."""
    import msgspec

    from engine.sampling_params import SamplingParams

    defaults = {f.name: f.default for f in msgspec.structs.fields(SamplingParams)}
    for field, (flag, options) in _FLAGS.items():
        options = dict(options, dest=_dest(field))
        if "default" not in options and options.get("action") != "store_true":
            default = defaults[field]
            options["default"] = None if default == () else default
        parser.add_argument(flag, **options)


def sampling_params(args: argparse.Namespace, structured_outputs: dict | None):
    """The ``SamplingParams`` of the parsed options (``ConfigError`` naming
    the option SamplingParams refuses)."""
    from engine.config import ConfigError
    from engine.sampling_params import SamplingParams

    fields = {field: getattr(args, _dest(field)) for field in _FLAGS}
    fields["stop_token_ids"] = _token_ids(fields["stop_token_ids"])
    try:
        return SamplingParams(structured_outputs=structured_outputs, **fields)
    except ValueError as e:
        raise ConfigError(_naming_flag(e)) from e


def check_thinking_budget(params, reasoning_parser: str | None) -> None:
    """The engine's refusal of a thinking budget without a reasoning parser,
    made before the engine starts (``reasoning_parser``: the configuration's
    resolved one)."""
    from engine.config import ConfigError
    from engine.thinking_budget import check_budget_has_parser

    try:
        check_budget_has_parser(params.thinking_token_budget, reasoning_parser)
    except ValueError as e:
        raise ConfigError(_naming_flag(e)) from e


def check_logprobs(params, max_logprobs: int) -> None:
    """The engine's refusal of more top logprobs than ``max_logprobs``
    (the configuration's), made before the engine starts for ``--logprobs``
    N >= 0; -1 is left to the engine (whether the vocabulary fits the cap
    is the model's to tell)."""
    from engine.config import ConfigError
    from engine.request import check_logprobs_limit

    if params.logprobs is None or params.logprobs == -1:
        return
    try:
        check_logprobs_limit(params.logprobs, max_logprobs, "--logprobs")
    except ValueError as e:
        raise ConfigError(f"{e}: give at most {max_logprobs}, or raise --max-logprobs "
                          "(-1: no limit)") from e


def _token_ids(text: str | None) -> list[int] | None:
    """``--stop-token-ids``' comma-separated ids (None: not given)."""
    from engine.config import ConfigError

    if text is None:
        return None
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise ConfigError(f"--stop-token-ids must be comma-separated integers: {e}") from e


def _naming_flag(error: ValueError) -> str:
    """``error``'s message, led by the flag of the field at fault: its
    ``param``, else the field its message names first (none found: the
    message alone)."""
    message = str(error)
    field = getattr(error, "param", None)
    if field not in _FLAGS:
        named = [(m.start(), name) for name in _FLAGS
                 if (m := re.search(rf"\b{name}\b", message))]
        field = min(named)[1] if named else None
    return message if field is None else f"{_FLAGS[field][0]}: {message}"
